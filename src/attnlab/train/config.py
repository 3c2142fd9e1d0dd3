"""TrainConfig: every knob of the generic training loop, validated on construction."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from attnlab.errors import UserError


def _opt(default: Any, help_text: str) -> Any:
    """A dataclass field with a default and a --help string for `add_dataclass_arguments`."""
    return field(default=default, metadata={"help": help_text})


@dataclass
class TrainConfig:
    """Hyper-parameters of `Trainer.fit`; see the field help strings for units and meaning.

    Batching: `data.batches(epoch)` yields GLOBAL micro-batches of dataset indices (summed over
    ranks, nominally `batch_size` each). One optimizer step consumes `grad_accum` consecutive
    micro-batches, so the global batch per optimizer step is `batch_size * grad_accum` items.
    Under DDP each micro-batch is sharded across ranks as `indices[rank::world_size]`.
    """

    epochs: int = _opt(10, "epochs to run (ignored when max_steps > 0)")
    max_steps: int = _opt(0, "optimizer steps to run; 0 = run `epochs` epochs")
    batch_size: int = _opt(64, "GLOBAL micro-batch size (summed over ranks) used by the data")
    grad_accum: int = _opt(1, "micro-batches per optimizer step")
    lr: float = _opt(1e-3, "peak learning rate")
    weight_decay: float = _opt(
        0.01, "AdamW decoupled decay for params with ndim>=2 that are not nn.Embedding weights"
    )
    betas: tuple[float, float] = _opt((0.9, 0.98), "AdamW betas, e.g. 0.9,0.98")
    optimizer: Literal["adamw", "muon"] = _opt(
        "adamw",
        "adamw: AdamW for every parameter; muon: Muon for the 2-D hidden weight matrices, AdamW "
        "(lr, betas, weight_decay) for embeddings, the output head, norms and biases",
    )
    muon_lr: float = _opt(0.02, "optimizer=muon: peak lr of the Muon matrices")
    muon_momentum: float = _opt(0.95, "optimizer=muon: Muon momentum")
    muon_nesterov: bool = _opt(True, "optimizer=muon: Nesterov momentum")
    muon_ns_steps: int = _opt(5, "optimizer=muon: Newton-Schulz iterations")
    muon_weight_decay: float = _opt(0.0, "optimizer=muon: decoupled weight decay of the matrices")
    muon_ns_dtype: Literal["float32", "bfloat16"] = _opt(
        "float32",
        "optimizer=muon: dtype of the Newton-Schulz iteration (torch.optim.Muon uses bfloat16, "
        "fast only where the hardware has bfloat16 matrix units)",
    )
    schedule: Literal["cosine", "linear", "noam", "constant", "wsd"] = _opt(
        "cosine", "lr schedule after warmup (wsd: warmup-stable-decay)"
    )
    decay_ratio: float = _opt(
        0.2, "wsd: share of the total steps spent in the final linear decay to min_lr_ratio"
    )
    warmup_steps: int = _opt(0, "linear warmup steps")
    warmup_ratio: float = _opt(0.0, "warmup as a fraction of total steps (when warmup_steps=0)")
    min_lr_ratio: float = _opt(0.0, "cosine/linear decay floor as a fraction of lr")
    noam_d_model: int = _opt(
        0, "noam: 0 = `lr` is the peak; >0 = paper's d_model^-0.5 scaling times `lr`"
    )
    clip_norm: float = _opt(1.0, "clip the global gradient norm to this; 0 = off")
    eval_every: int = _opt(0, "optimizer steps between evals; 0 = at the end of every epoch")
    eval_start: int = _opt(
        0,
        "no periodic evaluation before this optimizer step (the last step is always evaluated); "
        "saves time when only later evaluations matter, e.g. for target_loss",
    )
    checkpoint_every: int = _opt(
        200, "optimizer steps between resumable checkpoints (also at every eval); 0 = evals only"
    )
    patience: int = _opt(0, "evals without improvement before early stop; 0 = off")
    monitor: str = _opt("val_loss", "key of evaluate()'s dict that selects the best model")
    monitor_mode: Literal["min", "max"] = _opt("min", "whether lower or higher monitor is better")
    seed: int = _opt(0, "seed for python/numpy/torch RNGs (rank r uses seed + r)")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = _opt(
        "auto", "autocast dtype; auto = fastest measured on this device"
    )
    log_every: int = _opt(10, "optimizer steps between train-loss log events")
    tensorboard: bool = _opt(True, "write TensorBoard scalars under run_dir/tensorboard")
    num_threads: int = _opt(0, "torch.set_num_threads; 0 = leave the default")
    target_loss: float = _opt(
        0.0,
        "stop as soon as an evaluation's monitor value reaches this (<= for monitor_mode=min, "
        ">= for max); 0 = off. The summary records target_reached, target_step, and the training "
        "time until then without evaluations: target_time_s (wall), target_cpu_s (process CPU)",
    )
    max_minutes: float = _opt(
        0.0, "stop (evaluating first) once training wall time reaches this; 0 = no time limit"
    )
    schedule_by_time: bool = _opt(
        False,
        "with max_minutes > 0 (else ignored): advance the lr schedule by max(step, time) "
        "progress so a run the clock stops still ends its warmup+decay (timing-dependent, so "
        "not bitwise reproducible)",
    )

    def __post_init__(self) -> None:
        """Reject values the loop cannot run with, naming the field and the fix."""
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            choices = typing.get_args(hints[f.name])
            if typing.get_origin(hints[f.name]) is Literal and getattr(self, f.name) not in choices:
                raise UserError(
                    f"{f.name} must be one of {', '.join(choices)}, got {getattr(self, f.name)!r}"
                )
        positive = {"batch_size": self.batch_size, "grad_accum": self.grad_accum}
        positive |= {"log_every": self.log_every}
        for name, value in positive.items():
            if value < 1:
                raise UserError(f"{name} must be >= 1, got {value}")
        non_negative = {
            "max_steps": self.max_steps,
            "warmup_steps": self.warmup_steps,
            "noam_d_model": self.noam_d_model,
            "eval_every": self.eval_every,
            "eval_start": self.eval_start,
            "checkpoint_every": self.checkpoint_every,
            "patience": self.patience,
            "num_threads": self.num_threads,
            "weight_decay": self.weight_decay,
            "clip_norm": self.clip_norm,
            "muon_weight_decay": self.muon_weight_decay,
            "target_loss": self.target_loss,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise UserError(f"{name} must be >= 0, got {value}")
        if self.max_steps == 0 and self.epochs < 1:
            raise UserError(f"epochs must be >= 1 when max_steps == 0, got {self.epochs}")
        for name in ("lr", "muon_lr"):
            if not getattr(self, name) > 0:
                raise UserError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.muon_momentum < 1.0:
            raise UserError(f"muon_momentum must be in [0, 1), got {self.muon_momentum}")
        if not 1 <= self.muon_ns_steps < 100:
            raise UserError(f"muon_ns_steps must be in [1, 100), got {self.muon_ns_steps}")
        if not 0.0 <= self.decay_ratio <= 1.0:
            raise UserError(f"decay_ratio must be in [0, 1], got {self.decay_ratio}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise UserError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise UserError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise UserError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.schedule == "noam" and self.warmup_steps == 0 and self.warmup_ratio == 0.0:
            raise UserError("schedule='noam' needs warmup: set warmup_steps or warmup_ratio > 0")
