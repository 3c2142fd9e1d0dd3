"""Weighted running sums for loss and metrics, and the loop's resumable progress counters."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from attnlab.train.distributed import DistEnv, all_reduce_sum


@dataclass
class WeightedSums:
    """Sums of value*weight and of weight per name (plus a token count); `means()` averages."""

    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    tokens: float = 0.0

    def add(self, name: str, value: float, weight: float) -> None:
        """Accumulate `value` with `weight` under `name`."""
        self.sums[name] = self.sums.get(name, 0.0) + value * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def merge(self, other: WeightedSums) -> None:
        """Add every sum of `other` into this one."""
        for name in other.sums:
            self.sums[name] = self.sums.get(name, 0.0) + other.sums[name]
            self.weights[name] = self.weights.get(name, 0.0) + other.weights[name]
        self.tokens += other.tokens

    def means(self) -> dict[str, float]:
        """Weighted mean per name (names whose total weight is 0 are left out)."""
        return {k: self.sums[k] / w for k, w in self.weights.items() if w > 0}

    def all_reduce(self, env: DistEnv) -> WeightedSums:
        """Sum over ranks (every rank must hold the same names) and return self."""
        if not env.distributed:
            return self
        names = sorted(self.sums)
        flat = [self.tokens] + [self.sums[k] for k in names] + [self.weights[k] for k in names]
        values = all_reduce_sum(torch.tensor(flat, dtype=torch.float64, device=env.device), env)
        reduced = values.tolist()  # (1 + 2 * len(names),)
        self.tokens = reduced[0]
        self.sums = dict(zip(names, reduced[1 : 1 + len(names)]))
        self.weights = dict(zip(names, reduced[1 + len(names) :]))
        return self


@dataclass
class LoopState:
    """Everything about the loop's progress that a checkpoint must restore."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # epoch of the next batch
    batch_pos: int = 0  # micro-batches of `epoch` already consumed
    best_metric: float | None = None
    best_step: int | None = None
    bad_evals: int = 0  # evals since the last improvement (early stopping)
    elapsed_s: float = 0.0  # training wall time before the current process started
    eval_s: float = 0.0  # wall time spent in evaluations (part of elapsed_s)
    cpu_s: float = 0.0  # this process's CPU time (time.process_time) like elapsed_s
    eval_cpu_s: float = 0.0  # CPU time spent in evaluations (part of cpu_s)
    target_step: int | None = None  # step of the eval that reached TrainConfig.target_loss
    target_time_s: float | None = None  # wall time without evaluations at that step
    target_cpu_s: float | None = None  # CPU time without evaluations at that step
    stop_reason: str | None = None  # set once the run has finished
    last_train_loss: float | None = None
    window: WeightedSums = field(default_factory=WeightedSums)  # train sums since the last log

    def to_dict(self) -> dict:
        """JSON-able form for trainer.json."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LoopState:
        """Inverse of `to_dict`."""
        data = dict(data)
        window = WeightedSums(**data.pop("window"))
        return cls(**data, window=window)
