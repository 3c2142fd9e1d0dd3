"""Recorded attention calls -> the page's JSON: groups of (layers, heads, Tq, Tk) arrays.

Numbers travel as little-endian float32 in base64 (the page decodes them into Float32Arrays),
so the page holds exactly the float32 values the model computed. Masks travel as one byte per
(query, key) cell. Raw scores (q·kᵀ before the 1/√d_k scale, for the scale slider) are kept
while the page stays under :data:`SCORE_BUDGET` numbers per group.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlab.errors import UserError
from attnlab.layers.attention_record import AttentionCall

# Raw scores double a group's size; past this many numbers (L·H·Tq·Tk) they are left out and the
# page says why (a 1,000-token input of a 2-layer, 4-head model is 8 million).
SCORE_BUDGET = 4_000_000


def f32(t: Tensor | np.ndarray) -> str:
    """A tensor as base64 of its float32 little-endian bytes (row-major)."""
    a = t.detach().cpu().float().numpy() if isinstance(t, Tensor) else np.asarray(t, np.float32)
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode("ascii")


def u8(t: Tensor | np.ndarray) -> str:
    """A bool/0-1 tensor as base64 of one byte per value."""
    a = t.detach().cpu().numpy() if isinstance(t, Tensor) else np.asarray(t)
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.uint8).tobytes()).decode("ascii")


def decode_f32(text: str, shape: Sequence[int]) -> np.ndarray:
    """Inverse of :func:`f32` (tests read the page's numbers back with it)."""
    return np.frombuffer(base64.b64decode(text), dtype="<f4").reshape(shape)


def calls_named(calls: list[AttentionCall], suffix: str) -> list[AttentionCall]:
    """The calls made by modules whose name ends with ``suffix`` (e.g. ``cross_attn``)."""
    return [c for c in calls if c.module.endswith(suffix)]


def build_group(
    name: str,
    calls: list[AttentionCall],
    row: int,
    query_tokens: list[str],
    key_tokens: list[str],
    *,
    note: str = "",
) -> dict[str, Any]:
    """One attention kind (e.g. encoder self-attention) of one batch row, all its layers.

    ``calls`` are the recorder's calls of this kind in layer order; each (B, H, Tq, Tk). A row
    shorter than its batch (padded) keeps its own length: the tokens given, no padding.
    """
    if not calls:
        raise UserError(
            f"no softmax attention was recorded for {name}; this model's attention (linear "
            "attention?) forms no weights to show"
        )
    nq, nk = len(query_tokens), len(key_tokens)
    weights = _stack_layers([c.weights[row, :, :nq, :nk] for c in calls])  # (L, H, nq, nk)
    L, H, Tq, Tk = weights.shape
    if (Tq, Tk) != (nq, nk):
        raise AssertionError(f"{name}: {Tq}x{Tk} weights for {nq}x{nk}")
    mask = _mask_of(calls[0], row)[:nq, :nk]  # (Tq, Tk)
    for call in calls[1:]:
        if not torch.equal(_mask_of(call, row)[:nq, :nk], mask):
            raise AssertionError(f"{name}: layers differ in their masks")
    group: dict[str, Any] = {
        "name": name,
        "note": note,
        "layers": L,
        "heads": H,
        "tq": Tq,
        "tk": Tk,
        "query_tokens": query_tokens,
        "key_tokens": key_tokens,
        "weights": f32(weights),
        "causal": bool(calls[0].is_causal),
        "mask": u8(mask),
        "scale": calls[0].scale,
        "d_k": round(calls[0].scale ** -2),
        "scores": None,
        "bias": None,
        "scores_note": "",
    }
    if L * H * Tq * Tk <= SCORE_BUDGET:
        group["scores"] = f32(_stack_layers([c.scores[row, :, :Tq, :Tk] for c in calls]))
        if calls[0].bias is not None:
            bias = _stack_layers(
                [
                    c.bias.expand(c.weights.shape)[row, :, :Tq, :Tk]
                    for c in calls
                    if c.bias is not None
                ]
            )  # (L, H, Tq, Tk)
            group["bias"] = f32(bias)
    else:
        group["scores_note"] = (
            f"raw scores left out: {L}·{H}·{Tq}·{Tk} numbers exceed the page budget of "
            f"{SCORE_BUDGET:,}; explore a shorter input to use the scale slider"
        )
    return group


def _stack_layers(layers: list[Tensor]) -> Tensor:
    """Per-layer (H_l, Tq, Tk) -> (L, H, Tq, Tk); a layer with fewer heads (a pruned model,
    `attnlab prune`) is padded with all-zero heads after its own."""
    H = max(t.shape[0] for t in layers)
    return torch.stack(
        [torch.nn.functional.pad(t, (0, 0, 0, 0, 0, H - t.shape[0])) for t in layers]
    )


def _mask_of(call: AttentionCall, row: int) -> Tensor:
    """The (Tq, Tk) mask applied in one call (all True when none), the same for every head."""
    Tq, Tk = call.weights.shape[-2:]
    if call.mask is None:
        return torch.ones(Tq, Tk, dtype=torch.bool)
    mask = call.mask.expand(call.weights.shape)[row]  # (H, Tq, Tk)
    if not bool((mask == mask[:1]).all()):
        raise AssertionError("a mask that differs between heads")
    return mask[0].cpu()


def rollout(weights: Tensor, residual: float = 0.5) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020): R = Ã_L ··· Ã_1 with Ã = r·I + (1−r)·mean_h A,
    rows renormalised. weights (L, H, T, T) -> (T, T)."""
    eye = torch.eye(weights.shape[-1], dtype=weights.dtype)
    out = eye
    for layer in weights:
        a = residual * eye + (1 - residual) * layer.mean(dim=0)  # (T, T)
        a = a / a.sum(dim=-1, keepdim=True)
        out = a @ out
    return out
