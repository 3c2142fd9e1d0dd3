"""How every attention path reads its inputs: q, k, v of any rank, and a mask or bias of any
rank against the scores (…, Tq, Tk). :mod:`attnlab.layers.attention` and the flash kernels
(:mod:`attnlab.layers.flash`, :mod:`attnlab.layers.flash_triton`) share these rules, so they
live below all of them.

The mask rule, one for all of attnlab (any dimension may also be 1):

* 2-D ``(Tq, Tk)``: one mask shared by every sample and head;
* 3-D ``(B, Tq, Tk)``: one mask per sample, shared by the heads;
* 4-D ``(B, H, Tq, Tk)``: per sample and per head (a key padding mask is (B, 1, 1, Tk));

for inputs with more leading dimensions (…, Tq, D), a mask of the inputs' rank. Any other rank,
or a size that is neither the input's nor 1, is refused with a message saying how to reshape:
nothing is guessed (a 3-D mask is never read as one mask per head).
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_qkv(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> None:
    """q (…, Tq, Dk), k (…, Tk, Dk), v (…, Tk, Dv), floating point, with the same leading
    dimensions (all but the heads, the third from the end with four or more dimensions, which
    may differ for grouped-query attention), and Tk >= Tq under a causal mask; else ValueError."""
    n = q.dim()
    if n < 2 or k.dim() != n or v.dim() != n:
        raise ValueError(
            "q, k, v must have the same number of dimensions (…, T, D), at least 2, e.g. "
            f"(B, H, T, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.is_floating_point() and k.is_floating_point() and v.is_floating_point()):
        raise ValueError(f"q, k, v must be floating point, got {q.dtype}, {k.dtype}, {v.dtype}")
    outer = 3 if n >= 4 else 2  # the leading dimensions that must agree (heads may differ)
    if (
        not q.shape[:-outer] == k.shape[:-outer] == v.shape[:-outer]
        or k.shape[-2] != v.shape[-2]
        or k.shape[-1] != q.shape[-1]
    ):
        raise ValueError(
            "q (…, Tq, Dk), k (…, Tk, Dk), v (…, Tk, Dv) must agree in their leading dimensions "
            f"(all but the heads), k and v in length, q and k in width; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if is_causal and k.shape[-2] < q.shape[-2]:
        raise ValueError(f"a causal mask needs Tk >= Tq, got Tq={q.shape[-2]}, Tk={k.shape[-2]}")


def _shape_names(rank: int) -> str:
    """How attnlab names the dimensions of a mask of the given rank, e.g. '(B, H, Tq, Tk)'."""
    names = {2: "(Tq, Tk)", 3: "(B, Tq, Tk)", 4: "(B, H, Tq, Tk)"}
    return names.get(rank, "(B, …, H, Tq, Tk)")


def normalize_mask(mask: Tensor, target: tuple[int, ...], name: str = "mask") -> Tensor:
    """``mask`` viewed with the rank of ``target`` = (*lead, Tq, Tk), by attnlab's one rule.

    2-D ``(Tq, Tk)`` is shared by all; 3-D ``(B, Tq, Tk)`` is per sample (B = ``target[0]``),
    shared over the other leading dimensions (heads); a mask of ``target``'s rank is taken as
    is. Every dimension must equal ``target``'s or be 1. Anything else raises a ValueError
    saying how to reshape. Returns a view (only size-1 dimensions are added). Also applies to an
    additive ``bias`` (``name="bias"``), whose ranks are read the same way.
    """
    n, r = len(target), mask.dim()
    shape = tuple(mask.shape)
    if r == 2:
        viewed = mask.reshape(*(1,) * (n - 2), *shape)
    elif r == 3 and n >= 3:
        viewed = mask.reshape(shape[0], *(1,) * (n - 3), *shape[1:])
    elif r == n:
        viewed = mask
    else:
        ranks = "2-D (Tq, Tk)" + (", 3-D (B, Tq, Tk)" if n >= 3 else "")
        if n > 3:
            ranks += f" or {n}-D {_shape_names(n)}"
        raise ValueError(
            f"{name} of shape {shape} has {r} dimensions for inputs with target {target}; a "
            f"{name} is {ranks}: reshape it, e.g. a per-head (H, Tq, Tk) one as {name}[None] "
            "and a key padding one as (B, 1, 1, Tk)"
        )
    if any(m not in (1, t) for m, t in zip(viewed.shape, target)):
        if r == 3 and n > 3 and shape[0] not in (1, target[0]):
            hint = (
                f"a 3-D {name} is one per sample (B, Tq, Tk), but its first dimension "
                f"{shape[0]} is not the batch size {target[0]}; for one per head pass "
                f"(1, H, Tq, Tk), i.e. {name}[None]"
            )
        else:
            hint = "a key padding mask is (B, 1, 1, Tk), a causal mask (1, 1, Tq, Tk)"
        sizes = target if r == n else target[:1] + target[-2:] if r == 3 else target[-2:]
        raise ValueError(
            f"{name} of shape {shape} does not broadcast to {_shape_names(r)} = {sizes}; {hint}"
        )
    return viewed


def check_mask(mask: Tensor, target: tuple[int, ...]) -> Tensor:
    """A boolean ``mask`` read by :func:`normalize_mask`, else a clear ValueError."""
    if mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be a bool tensor (True = may attend), got {mask.dtype}; convert PyTorch "
            "masks with from_attn_mask / from_key_padding_mask, or pass an additive float as bias="
        )
    return normalize_mask(mask, target)


def as_4d(t: Tensor, n: int, outer: tuple[int, ...] | None = None) -> Tensor:
    """An n-D (…, H, X, Y) tensor as (N, H, X, Y): (X, Y) -> (1, 1, X, Y), (B, X, Y) ->
    (B, 1, X, Y); for n > 4 the dimensions before the heads become one (a mask's size-1
    dimensions there are first expanded to ``outer``, unless all of them are 1)."""
    if n == 2:
        return t[None, None]
    if n == 3:
        return t[:, None]
    inner = t.shape[-3:]
    if outer is not None and any(size != 1 for size in t.shape[:-3]):
        t = t.expand(*outer, *inner)
    return t.reshape(-1, *inner)
