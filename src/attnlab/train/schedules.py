"""Learning-rate schedules as pure functions of the optimizer step.

`step` is 1-based: the k-th optimizer update uses `lr * lr_factor(k, ...)`.
"""

from __future__ import annotations

import math

from attnlab.errors import UserError

SCHEDULES = ("cosine", "linear", "noam", "constant", "wsd")


def resolve_warmup(warmup_steps: int, warmup_ratio: float, total_steps: int) -> int:
    """Warmup length: `warmup_steps` if > 0, else round(warmup_ratio * total_steps)."""
    return warmup_steps if warmup_steps > 0 else round(warmup_ratio * total_steps)


def lr_factor(
    step: int,
    *,
    schedule: str,
    total_steps: int,
    warmup_steps: int,
    min_lr_ratio: float = 0.0,
    noam_d_model: int = 0,
    decay_ratio: float = 0.2,
) -> float:
    """Multiplier on the peak lr for 1-based optimizer `step`.

    cosine/linear/constant: linear warmup `step / warmup` up to 1 (Goyal et al. 2017), then
      cosine:   m + (1 - m) * (1 + cos(pi * p)) / 2   (Loshchilov & Hutter 2017, SGDR eq. 5)
      linear:   m + (1 - m) * (1 - p)
      constant: 1
    where p = (step - warmup) / (total - warmup) clamped to [0, 1] and m = min_lr_ratio, so the
    last step runs at min_lr_ratio * lr.
    wsd (warmup-stable-decay; Hu et al. 2024, MiniCPM, sec. 4): the same warmup, then 1 until the
      last D = round(decay_ratio * total) steps, which decay linearly: m + (1 - m) * (1 - q) with
      q = (step - (total - D)) / D, so the last step runs at m * lr. The decay never starts
      before the warmup ends (it is shortened to fit); D = 0 is warmup then constant.
    noam (Vaswani et al. 2017, eq. 3): d^-0.5 * min(step^-0.5, step * warmup^-1.5).
      With noam_d_model == 0 the factor is normalised by its peak warmup^-0.5, so `lr` is the
      peak lr (reached at step == warmup); with noam_d_model = d > 0 it is the paper's formula
      and `lr` is a plain multiplier (lr=1 reproduces the paper). min_lr_ratio is not used.
    """
    if step < 1:
        raise UserError(f"step is 1-based and must be >= 1, got {step}")
    if schedule not in SCHEDULES:
        raise UserError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if schedule == "noam":
        if warmup_steps < 1:
            raise UserError("schedule='noam' needs warmup_steps >= 1")
        scale = noam_d_model**-0.5 if noam_d_model > 0 else warmup_steps**0.5
        return scale * min(step**-0.5, step * warmup_steps**-1.5)
    if step <= warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        if not 0.0 <= decay_ratio <= 1.0:
            raise UserError(f"decay_ratio must be in [0, 1], got {decay_ratio}")
        decay_start = max(warmup_steps, total_steps - round(decay_ratio * total_steps))
        if step <= decay_start or total_steps <= decay_start:
            return 1.0
        q = min(1.0, (step - decay_start) / (total_steps - decay_start))
        return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - q)
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - progress)
