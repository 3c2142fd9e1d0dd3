"""Dropout (Srivastava et al. 2014) with a cheaper mask on the CPU.

Training: y = x ⊙ m / (1 − p), m_i ~ Bernoulli(1 − p) independently; evaluation: y = x.
The function and its arithmetic are ``F.dropout``'s (the mask m / (1 − p) in x's dtype,
multiplied in); only how m is drawn on the CPU differs. torch draws it with ``bernoulli_``, two
Mersenne-Twister calls and a double comparison per element in a serial loop: in the
fine-tuning step of the e5 classifier that was a fifth of a bf16 step
(docs/results/e5_step_time.md). Here each 64-bit word of the generator is read as two 32-bit
integers u, uniform on [−2³¹, 2³¹), and an element is kept when u ≥ −2³¹ + round(p · 2³²):
P(keep) = 1 − p within 2⁻³³. The draws come from torch's default CPU generator, so
``manual_seed``, the RNG state a checkpoint saves and gradient checkpointing's replay govern
them as they govern ``bernoulli_``; the stream differs from ``F.dropout``'s, so the same seed
draws other masks. Other devices (CUDA's fused Philox kernel) call ``F.dropout``, and so does a
module traced by ``torch.compile``: Dynamo cannot trace the in-place ``random_`` (it would break
the graph at every dropout), and Inductor draws its own masks inside the fused kernel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_WORD = 2**32  # values of one 32-bit draw


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype) -> Tensor:
    """Bernoulli(1 − p) draws of ``shape`` as 0 and 1 in ``dtype``, from torch's default CPU
    generator."""
    n = math.prod(shape)
    words = torch.empty((n + 1) // 2, dtype=torch.int64).random_(-(2**63), None)  # 64 bits each
    u = words.view(torch.int32)[:n].view(shape)  # uniform on [-2^31, 2^31)
    threshold = round(p * _WORD) - _WORD // 2
    return torch.ge(u, threshold, out=torch.empty(shape, dtype=dtype))  # 1 with P = 1 - p


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)``: the same function, the mask drawn by :func:`keep_mask` on
    the CPU."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p == 1.0 or not x.is_floating_point():
        return F.dropout(x, p, training)
    if torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    noise = keep_mask(x.shape, p, x.dtype).div_(1.0 - p)  # m / (1 - p), as F.dropout forms it
    return x * noise


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same ``p``, no state, not in place) whose forward is :func:`dropout`."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)
