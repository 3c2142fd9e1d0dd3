"""TrainConfig: every knob of the generic training loop, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from attnlab.configs import ConfigBase, setting
from attnlab.errors import UserError


@dataclass
class TrainConfig(ConfigBase):
    """Hyper-parameters of `Trainer.fit`; see the field help strings for units and meaning.

    Batching: `data.batches(epoch)` yields GLOBAL micro-batches of dataset indices (summed over
    ranks, nominally `batch_size` each). One optimizer step consumes `grad_accum` consecutive
    micro-batches, so the global batch per optimizer step is `batch_size * grad_accum` items.
    Under DDP each micro-batch is sharded across ranks as `indices[rank::world_size]`.
    """

    epochs: int = setting(10, "epochs to run (ignored when max_steps > 0)")
    max_steps: int = setting(0, "optimizer steps to run; 0 = run `epochs` epochs", min=0)
    batch_size: int = setting(
        64, "GLOBAL micro-batch size (summed over ranks) used by the data", min=1
    )
    grad_accum: int = setting(1, "micro-batches per optimizer step", min=1)
    lr: float = setting(1e-3, "peak learning rate", above=0)
    lr_decay: float = setting(
        1.0,
        "layer-wise lr decay (AdamW): a parameter at depth k below the output (the model's "
        "layer_depths(): head 0, top layer 1, ...) learns at lr * lr_decay^k; 1 = one rate",
        above=0,
        max=1,
    )
    weight_decay: float = setting(
        0.01,
        "AdamW decoupled decay for params with ndim>=2 that are not nn.Embedding weights",
        min=0,
    )
    betas: tuple[float, float] = setting((0.9, 0.98), "AdamW betas, e.g. 0.9,0.98")
    optimizer: Literal["adamw", "muon"] = setting(
        "adamw",
        "adamw: AdamW for every parameter; muon: Muon for the 2-D hidden weight matrices, AdamW "
        "(lr, betas, weight_decay) for embeddings, the output head, norms and biases",
    )
    muon_lr: float = setting(0.02, "optimizer=muon: peak lr of the Muon matrices", above=0)
    muon_momentum: float = setting(0.95, "optimizer=muon: Muon momentum", min=0, below=1)
    muon_nesterov: bool = setting(True, "optimizer=muon: Nesterov momentum")
    muon_ns_steps: int = setting(5, "optimizer=muon: Newton-Schulz iterations", min=1, below=100)
    muon_weight_decay: float = setting(
        0.0, "optimizer=muon: decoupled weight decay of the matrices", min=0
    )
    muon_ns_dtype: Literal["float32", "bfloat16"] = setting(
        "float32",
        "optimizer=muon: dtype of the Newton-Schulz iteration (torch.optim.Muon uses bfloat16, "
        "fast only where the hardware has bfloat16 matrix units)",
    )
    schedule: Literal["cosine", "linear", "noam", "constant", "wsd"] = setting(
        "cosine", "lr schedule after warmup (wsd: warmup-stable-decay)"
    )
    decay_ratio: float = setting(
        0.2,
        "wsd: share of the total steps spent in the final linear decay to min_lr_ratio",
        min=0,
        max=1,
    )
    warmup_steps: int = setting(0, "linear warmup steps", min=0)
    warmup_ratio: float = setting(
        0.0, "warmup as a fraction of total steps (when warmup_steps=0)", min=0, below=1
    )
    min_lr_ratio: float = setting(
        0.0, "cosine/linear decay floor as a fraction of lr", min=0, max=1
    )
    noam_d_model: int = setting(
        0, "noam: 0 = `lr` is the peak; >0 = paper's d_model^-0.5 scaling times `lr`", min=0
    )
    clip_norm: float = setting(1.0, "clip the global gradient norm to this; 0 = off", min=0)
    eval_every: int = setting(
        0, "optimizer steps between evals; 0 = at the end of every epoch", min=0
    )
    eval_start: int = setting(
        0,
        "no periodic evaluation before this optimizer step (the last step is always evaluated); "
        "saves time when only later evaluations matter, e.g. for target_loss",
        min=0,
    )
    checkpoint_every: int = setting(
        200,
        "optimizer steps between resumable checkpoints (also at every eval); 0 = evals only",
        min=0,
    )
    patience: int = setting(0, "evals without improvement before early stop; 0 = off", min=0)
    monitor: str = setting(
        "val_loss",
        "the evaluation metric whose best value chooses the weights kept: val_loss, val_acc, "
        "...; classify also val_macro_f1 and ood_dev_acc / ood_dev_macro_f1 / ood_dev_loss "
        "(the bundled out-of-domain dev set)",
    )
    monitor_mode: Literal["min", "max"] = setting(
        "min", "whether lower or higher monitor is better"
    )
    seed: int = setting(0, "seed for python/numpy/torch RNGs (rank r uses seed + r)")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = setting(
        "auto",
        "autocast dtype; auto = fp32 where the device lacks a fast low precision, else the faster "
        "of fp32 and it on this model's step, timed once and recorded in the data cache "
        "(precision.json) for later runs; fp16 needs CUDA",
    )
    log_every: int = setting(10, "optimizer steps between train-loss log events", min=1)
    tensorboard: bool = setting(True, "write TensorBoard scalars under run_dir/tensorboard")
    keep_state: bool = setting(
        False,
        "keep state/ (the last checkpoint: weights, optimizer moments, RNG) once training "
        "ends, to train the run further with --resume and a higher limit; false: removed, "
        "the run keeps what its verbs read",
    )
    num_threads: int = setting(0, "torch.set_num_threads; 0 = leave the default", min=0)
    target_loss: float = setting(
        0.0,
        "stop as soon as an evaluation's monitor value reaches this (<= for monitor_mode=min, "
        ">= for max); 0 = off. The summary records target_reached, target_step, and the training "
        "time until then without evaluations: target_time_s (wall), target_cpu_s (process CPU)",
        min=0,
    )
    max_minutes: float = setting(
        0.0, "stop (evaluating first) once training wall time reaches this; 0 = no time limit"
    )
    schedule_by_time: bool = setting(
        False,
        "with max_minutes > 0 (else ignored): advance the lr schedule by max(step, time) "
        "progress so a run the clock stops still ends its warmup+decay (timing-dependent, so "
        "not bitwise reproducible)",
    )

    def check(self) -> None:
        """Cross-field rules; each field's own range is declared with its setting."""
        if self.max_steps == 0 and self.epochs < 1:
            raise UserError(f"epochs must be >= 1 when max_steps == 0, got {self.epochs}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise UserError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.schedule == "noam" and self.warmup_steps == 0 and self.warmup_ratio == 0.0:
            raise UserError("schedule='noam' needs warmup: set warmup_steps or warmup_ratio > 0")
        if self.lr_decay < 1.0 and self.optimizer != "adamw":
            raise UserError(
                f"--optimizer {self.optimizer} trains without layer-wise lr decay, but lr_decay "
                f"is {self.lr_decay:g} (the preset's value, where --lr-decay was not given); add "
                "--lr-decay 1, or keep --optimizer adamw"
            )


def check_num_threads(value: int) -> None:
    """--num-threads of a verb that trains nothing (bench, verify), held to the bound that
    TrainConfig.num_threads declares for training."""
    (field,) = (f for f in fields(TrainConfig) if f.name == "num_threads")
    if value < field.metadata["min"]:
        raise UserError(
            f"--num-threads must be >= {field.metadata['min']} (0 = torch's default), got {value}"
        )
