"""Attention, written out: scaled dot-product attention step by step, the masks it reads, and
multi-head attention with its KV cache (Vaswani et al. 2017, "Attention Is All You Need", §3.2).

Read top to bottom:

1. :func:`explicit_attention`: eq. 1, one line per step, on per-head tensors (B, H, T, Dh).
2. :func:`scaled_dot_product_attention`: the one entry point the models call. It takes any
   rank, reads the mask, and computes the same numbers by one of four **backends** (the *how*;
   *what* is computed, full, local or linear attention, is :mod:`attnlab.layers.efficient`'s):

   * ``"explicit"``: :func:`explicit_attention`, the textbook steps; the only one that forms the
     weights, so ``need_weights=True`` and an active recorder
     (:class:`attnlab.layers.attention_record.record_attention`) always take it;
   * ``"fused"`` (the default): PyTorch's ``F.scaled_dot_product_attention``;
   * ``"matmul"``: :func:`matmul_attention`, two batched matrix products around a softmax, every
     step in the products' dtype, the weights not returned, for bf16 or fp16 rows of at most
     ``MATMUL_MAX_KEYS`` keys, where it runs faster than torch's CPU flash kernel; float32 and
     float64 calls and longer rows take the fused kernel (benchmarks/attention/short_rows.py);
   * ``"flash"``: attnlab's FlashAttention written by hand (:mod:`attnlab.layers.flash`);
   * ``"triton"``: its forward as a Triton kernel (:mod:`attnlab.layers.flash_triton`, CUDA).

   The flash kernels and ``"matmul"`` take no dropout, and the flash kernels no additive bias:
   a call with either runs on the fused kernel instead.
3. The masks. One convention for all of attnlab: a **boolean** tensor where ``True`` means
   *may attend*, broadcastable to (B, H, Tq, Tk): 2-D (Tq, Tk) is shared by all, 3-D
   (B, Tq, Tk) is per sample, 4-D (B, H, Tq, Tk) per sample and head (a key padding mask is
   (B, 1, 1, Tk)); anything else is refused with a message saying how to reshape
   (:func:`attnlab.layers.shapes.normalize_mask`, the rule in full). PyTorch's ``key_padding_mask``
   and boolean ``attn_mask`` use the opposite sense (True = ignore): convert them at the
   boundary with :func:`from_key_padding_mask` and :func:`from_attn_mask`. A query row with
   nothing to attend to yields zeros (and zero gradients), never NaN, as
   ``F.scaled_dot_product_attention`` does. Causal masks are aligned bottom-right: with Tq
   queries and Tk keys, query ``i`` sits at position ``Tk - Tq + i`` (the lower triangle when
   Tq == Tk; with a KV cache the new queries see every cached key and each other causally).
4. :class:`KVCache` and :class:`MultiHeadAttention` (self and cross, GQA/MQA, the cache).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, Protocol, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.attention_record import is_recording, record_call
from attnlab.layers.flash import flash_attention
from attnlab.layers.flash_triton import flash_attention_triton
from attnlab.layers.shapes import as_4d, check_mask, check_qkv, normalize_mask

# --------------------------------------------------------------------------- attention, explicitly


def explicit_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    bias: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V  (Vaswani et al. 2017, eq. 1), step by step.

    q (B, H, Tq, Dk); k (B, Hkv, Tk, Dk); v (B, Hkv, Tk, Dv), H a multiple of Hkv; ``mask``
    bool, True = may attend, broadcastable to (B, H, Tq, Tk); ``is_causal`` adds the decoder's
    mask (§3.2.3: no query sees a later key); ``bias`` an additive float (B|1, H|1, Tq, Tk)
    (relative positions, ALiBi); ``scale`` defaults to 1/√d_k. Returns the output
    (B, H, Tq, Dv) and the weights (B, H, Tq, Tk), in the products' dtype; the softmax runs in
    at least float32.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v, mask = every_head(q, k, v, mask, is_causal)

    raw = torch.matmul(q, k.transpose(-2, -1))  # Q Kᵀ                      (B, H, Tq, Tk)
    # the softmax reads the scores in at least float32 (bf16 / fp16 products are widened)
    scores = raw.to(torch.promote_types(raw.dtype, torch.float32)) * scale  # Q Kᵀ / √d_k
    if bias is not None:
        scores = scores + bias  # + a position bias                           (B, H, Tq, Tk)
    if mask is not None:
        # Masked keys get −∞ in the paper; the dtype's lowest finite value here, so a row with
        # nothing to attend to softmaxes to a harmless uniform row (no NaN) ...
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # (B, H, Tq, Tk)
    weights = torch.softmax(scores, dim=-1)  # softmax(·) over the keys      (B, H, Tq, Tk)
    if mask is not None:
        weights = weights * mask  # ... which this turns into zeros           (B, H, Tq, Tk)
    weights = weights.to(raw.dtype)  # the products' dtype again              (B, H, Tq, Tk)
    record_call(raw, scale, bias, mask, is_causal, weights)  # no-op unless recording
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)  # dropout on the weights (§5.4)
    out = torch.matmul(weights, v)  # softmax(·) V                           (B, H, Tq, Dv)
    return out, weights


def every_head(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """k, v repeated to q's H heads (grouped-query attention: each of the Hkv key/value heads
    serves H / Hkv query heads) and ``mask`` with the decoder's causal mask added when
    ``is_causal``: (B, H, Tk, Dk), (B, H, Tk, Dv), (B|1, H|1, Tq|1, Tk) or None."""
    H, Hkv = q.shape[1], k.shape[1]
    if Hkv != H:
        k = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, Tk, Dk)
        v = v.repeat_interleave(H // Hkv, dim=1)  # (B, H, Tk, Dv)
    if is_causal:  # §3.2.3: no query sees a later key
        mask = combine_masks(mask, causal_mask(q.shape[2], k.shape[2], device=q.device))
    return k, v, mask


# --------------------------------------------------------------------------- one entry point

Backend = Literal["explicit", "fused", "matmul", "flash", "triton"]
BACKENDS: tuple[str, ...] = get_args(Backend)
# the longest bf16 / fp16 key rows the "matmul" backend computes: up to them it runs faster
# than torch's CPU flash kernel, at 512 its (B, H, Tq, Tk) scores cost more than the kernel's
# tiles; in float32 the kernel is the faster at every length (docs/results/attention_short_rows.md)
MATMUL_MAX_KEYS = 256
# run eagerly, the matmul backend pads bf16 / fp16 key rows with masked keys to a multiple of
# this, as torch's CPU softmax runs a row's tail past its last whole 32-lane vector several
# times slower; rows shorter than one vector are softmaxed in float32 instead, faster still
SOFTMAX_WIDTH = 32


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    *,
    bias: Tensor | None = None,
    scale: float | None = None,
    backend: Backend = "fused",
) -> tuple[Tensor, Tensor | None]:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + bias, masked) V, by ``backend``.

    q: (…, Tq, Dk); k: (…, Tk, Dk); v: (…, Tk, Dv) with any leading dimensions, as
    ``F.scaled_dot_product_attention``: typically (B, H, T, D), or (B, T, D) for one head.
    With four or more dimensions the third from the end is the head dimension and k, v may have
    fewer heads Hkv than q's H, H a multiple of Hkv (grouped-query attention); every other
    leading dimension must agree. mask: bool, True = may attend, read by
    :func:`attnlab.layers.shapes.normalize_mask` (2-D (Tq, Tk) shared, 3-D (B, Tq, Tk) per
    sample, or q's rank). bias: additive float scores, read by the same rule. Returns (output
    (…, Tq, Dv), weights (…, Tq, Tk) or None). ``backend``: the module docstring; every backend
    gives the same numbers, and weights come from ``"explicit"``, which ``need_weights`` or an
    active recorder choose whatever ``backend`` says.
    """
    check_qkv(q, k, v, is_causal)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    n = q.dim()
    target = (*q.shape[:-1], k.shape[-2])  # (…, Tq, Tk)
    if mask is not None:
        mask = check_mask(mask, target)
    if bias is not None:
        bias = normalize_mask(bias, target, name="bias")
    q4, k4, v4 = (as_4d(t, n) for t in (q, k, v))  # (N, H, T, D)
    mask4, bias4 = (None if t is None else as_4d(t, n, q.shape[:-3]) for t in (mask, bias))
    H, Hkv = q4.shape[1], k4.shape[1]
    if H % Hkv != 0 or v4.shape[1] != Hkv:
        raise ValueError(
            f"query heads ({H}) must be a multiple of key/value heads (k: {Hkv}, v: {v4.shape[1]})"
        )
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    weights = None
    if need_weights or is_recording() or backend == "explicit":
        out, weights = explicit_attention(
            q4, k4, v4, mask4, is_causal, bias=bias4, scale=scale, dropout_p=dropout_p
        )  # (N, H, Tq, Dv), (N, H, Tq, Tk)
    elif (
        backend == "matmul"
        and dropout_p == 0.0
        and product_dtype(q).itemsize < 4
        and k.shape[-2] <= MATMUL_MAX_KEYS
    ):
        out = matmul_attention(q4, k4, v4, mask4, is_causal, bias4, scale)  # (N, H, Tq, Dv)
    elif backend in ("flash", "triton") and bias is None and dropout_p == 0.0:
        kernel = flash_attention if backend == "flash" else flash_attention_triton
        out = kernel(q4, k4, v4, mask4, is_causal, scale=scale)  # (N, H, Tq, Dv)
    else:
        out = _fused_attention(q4, k4, v4, mask4, is_causal, bias4, dropout_p, scale)
    out = out.reshape(*q.shape[:-1], v.shape[-1])  # (…, Tq, Dv)
    return out, None if weights is None else weights.reshape(target)  # (…, Tq, Tk)


def product_dtype(q: Tensor) -> torch.dtype:
    """The dtype attention's products of ``q`` run in: autocast's where it is on and q is
    float32, else q's own."""
    kind = q.device.type
    if q.dtype == torch.float32 and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return q.dtype


def matmul_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    bias: Tensor | None,
    scale: float,
) -> Tensor:
    """Eq. 1 as two batched products around a softmax, for inference: the scores are written
    once, by ``baddbmm``, with the mask and bias entering as one additive term (masked keys get
    the dtype's lowest value), and every step runs in the products' dtype (:func:`product_dtype`;
    torch's softmax of bf16 / fp16 scores sums in float32 and rounds its output once, as the
    explicit path's cast of float32 weights does; run eagerly, a bf16 / fp16 row shorter than
    ``SOFTMAX_WIDTH`` is softmaxed in float32 and rounded, the same numbers, faster, and a
    longer one is padded with masked keys to a multiple of it).
    q (B, H, Tq, Dk); k (B, Hkv, Tk, Dk); v (B, Hkv, Tk, Dv); mask bool and bias float,
    broadcastable to (B, H, Tq, Tk) -> (B, H, Tq, Dv). A query row with no key to attend to
    gives zeros."""
    dtype = product_dtype(q)
    B, H, Tq, Dk = q.shape
    Tk, Dv = k.shape[2], v.shape[-1]
    k, v, mask = every_head(q, k, v, mask, is_causal)
    # torch's eager bf16 / fp16 softmax is slow on short rows (softmaxed in float32, then
    # rounded) and on a row's tail past its last whole vector (padded with masked keys); under
    # torch.compile the softmax is Inductor's own loop, and each such branch would be a graph
    eager = not torch.compiler.is_compiling()
    narrow = eager and dtype.itemsize < 4 and Tk < SOFTMAX_WIDTH
    pad = -Tk % SOFTMAX_WIDTH if eager and dtype.itemsize < 4 and not narrow else 0
    low = torch.finfo(dtype).min  # a masked key's score
    with torch.autocast(q.device.type, enabled=False):  # the dtype is chosen here, not by autocast
        add = None if bias is None else bias.to(dtype)  # (B|1, H|1, Tq|1, Tk)
        if mask is not None:
            base = torch.zeros((), dtype=dtype, device=q.device) if add is None else add
            add = base.masked_fill(~mask, low)  # (B|1, H|1, Tq|1, Tk)
        if pad:  # masked keys up to whole vectors
            if add is None:
                add = torch.zeros(1, 1, 1, Tk, dtype=dtype, device=q.device)
            add = F.pad(add, (0, pad), value=low)  # (B|1, H|1, Tq|1, Tk + pad)
            k, v = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))  # (B, H, Tk + pad, D)
            Tk += pad
        q3 = q.to(dtype).reshape(B * H, Tq, Dk)
        k3 = k.to(dtype).reshape(B * H, Tk, Dk)
        v3 = v.to(dtype).reshape(B * H, Tk, Dv)
        if add is None:
            scores = torch.bmm(q3, k3.transpose(1, 2)).mul_(scale)  # Q Kᵀ / √d_k (BH, Tq, Tk)
        else:  # + bias, masked                                                (BH, Tq, Tk)
            add = add.expand(B, H, Tq, Tk).reshape(B * H, Tq, Tk)
            scores = torch.baddbmm(add, q3, k3.transpose(1, 2), alpha=scale)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32 if narrow else None)
        weights = weights.to(dtype)  # softmax(·) over the keys                 (BH, Tq, Tk)
        out = torch.bmm(weights, v3).reshape(B, H, Tq, Dv)  # softmax(·) V     (B, H, Tq, Dv)
    if mask is not None:  # a row with no key softmaxed to a uniform row over masked keys
        out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # (B, H, Tq, Dv)
    return out


def _fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    bias: Tensor | None,
    dropout_p: float,
    scale: float,
) -> Tensor:
    """PyTorch's fused kernel with attnlab's conventions (mask sense, bottom-right causal
    alignment, zero rows, GQA); q (B, H, Tq, Dk), k, v (B, Hkv, Tk, D) -> (B, H, Tq, Dv)."""
    if _upcast_on_cpu(q, k, v, bias):
        # torch's CPU flash kernel runs its backward pass about 4x slower in bf16 or fp16 than
        # in float32 (docs/results/e5_step_time.md), so a CPU pass that will be differentiated
        # attends in float32, outside autocast (which would cast the inputs back down), and
        # returns the caller's dtype.
        with torch.autocast("cpu", enabled=False):
            out = _fused_attention(
                q.float(),
                k.float(),
                v.float(),
                mask,
                is_causal,
                None if bias is None else bias.float(),
                dropout_p,
                scale,
            )  # (B, H, Tq, Dv) float32
        return out.to(q.dtype)
    H, Hkv, Tq, Tk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    gqa = Hkv != H
    if is_causal and mask is None and bias is None and Tq == Tk:
        # Bottom-right and top-left alignment agree when Tq == Tk: let the kernel apply the
        # causal structure itself (it skips the blocks above the diagonal) instead of reading
        # a materialised (Tq, Tk) mask.
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale, enable_gqa=gqa
        )  # (B, H, Tq, Dv)
    if is_causal:
        mask = combine_masks(mask, causal_mask(Tq, Tk, device=q.device))  # (B|1, H|1, Tq, Tk)
    attn_mask: Tensor | None = mask
    if bias is not None:
        attn_mask = bias if mask is None else torch.where(mask, bias, float("-inf"))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=gqa
    )  # (B, H, Tq, Dv)
    if bias is not None and mask is not None:
        # With a float mask the kernel cannot tell "blocked" from "very unlikely": zero the rows
        # that attend to nothing so they match the explicit path.
        any_key = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, Tq|1, 1)
        out = out.masked_fill(~any_key, 0.0)
    return out


def _upcast_on_cpu(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> bool:
    """Whether a fused attention call is a CPU one in bf16/fp16 whose backward pass will run
    (grad mode on and an input that needs a gradient): it then attends in float32. The
    forward pass alone stays in the low precision, where the CPU kernel is the faster."""
    if q.device.type != "cpu" or q.dtype not in (torch.bfloat16, torch.float16):
        return False
    inputs = (q, k, v) if bias is None else (q, k, v, bias)
    return torch.is_grad_enabled() and any(t.requires_grad for t in inputs)


# --------------------------------------------------------------------------- masks


def padding_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """Key mask from sequence lengths: (B,) -> (B, 1, 1, T), True where a real token is."""
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}")
    T = int(lengths.max()) if max_len is None else max_len
    positions = torch.arange(T, device=lengths.device)  # (T,)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T)


def padding_mask_from_ids(ids: Tensor, pad_id: int = 0) -> Tensor:
    """Key mask from token ids: (B, T) -> (B, 1, 1, T), True where the id is not ``pad_id``."""
    if ids.dim() != 2:
        raise ValueError(f"ids must be (B, T), got shape {tuple(ids.shape)}")
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, T)


def causal_mask(t_q: int, t_k: int | None = None, device: torch.device | None = None) -> Tensor:
    """Bottom-right aligned causal mask (1, 1, Tq, Tk): query i may see keys j <= i + Tk - Tq."""
    t_k = t_q if t_k is None else t_k
    if t_k < t_q:
        raise ValueError(f"a causal mask needs Tk >= Tq, got Tq={t_q}, Tk={t_k}")
    i = torch.arange(t_q, device=device)[:, None]  # (Tq, 1)
    j = torch.arange(t_k, device=device)[None, :]  # (1, Tk)
    return (j <= i + (t_k - t_q))[None, None]  # (1, 1, Tq, Tk)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of boolean masks (None entries are skipped); None if all are None."""
    result = None
    for m in masks:
        if m is None:
            continue
        result = m if result is None else result & m
    return result


def from_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """PyTorch ``key_padding_mask`` (B, Tk), True/-inf = ignore -> attnlab mask (B, 1, 1, Tk)."""
    if key_padding_mask.dim() != 2:
        raise ValueError(
            f"key_padding_mask must be (B, Tk), got shape {tuple(key_padding_mask.shape)}"
        )
    if key_padding_mask.dtype == torch.bool:
        keep = ~key_padding_mask
    else:
        keep = _additive_to_bool(key_padding_mask, "key_padding_mask")
    return keep[:, None, None, :]  # (B, 1, 1, Tk)


def to_key_padding_mask(mask: Tensor) -> Tensor:
    """attnlab key mask (B, 1, 1, Tk) -> PyTorch ``key_padding_mask`` (B, Tk), True = ignore."""
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1:
        raise ValueError(f"expected a key mask of shape (B, 1, 1, Tk), got {tuple(mask.shape)}")
    return ~mask[:, 0, 0, :]  # (B, Tk)


def from_attn_mask(attn_mask: Tensor, n_heads: int | None = None) -> Tensor:
    """PyTorch ``attn_mask`` (Tq, Tk) or (B*H, Tq, Tk), True/-inf = blocked -> attnlab mask.

    Returns (1, 1, Tq, Tk) or (B, H, Tq, Tk). A float mask must hold only 0 and -inf; a general
    additive bias has no boolean meaning: pass it as ``bias=`` instead.
    """
    keep = (
        ~attn_mask if attn_mask.dtype == torch.bool else _additive_to_bool(attn_mask, "attn_mask")
    )
    if keep.dim() == 2:
        return keep[None, None]  # (1, 1, Tq, Tk)
    if keep.dim() == 3:
        if n_heads is None:
            raise ValueError("a 3-D attn_mask (B*H, Tq, Tk) needs n_heads to be unflattened")
        if keep.shape[0] % n_heads != 0:
            raise ValueError(
                f"a 3-D attn_mask is (B*H, Tq, Tk), but its first dimension {keep.shape[0]} is "
                f"not a multiple of n_heads={n_heads}; pass the model's number of heads"
            )
        return keep.view(-1, n_heads, *keep.shape[1:])  # (B, H, Tq, Tk)
    raise ValueError(f"attn_mask must be 2-D or 3-D, got shape {tuple(attn_mask.shape)}")


def to_attn_mask(mask: Tensor) -> Tensor:
    """attnlab mask -> PyTorch boolean ``attn_mask`` sense (True = blocked), same shape."""
    return ~mask


def _additive_to_bool(mask: Tensor, name: str) -> Tensor:
    """0 -> True (keep), -inf -> False (blocked); anything else is not a mask."""
    blocked = torch.isneginf(mask)
    if not torch.all(blocked | (mask == 0)):
        raise ValueError(
            f"{name} holds values other than 0 and -inf: that is an additive bias, not a mask; "
            "pass it as bias= instead"
        )
    return ~blocked


# --------------------------------------------------------------------------- KV cache


class KVCache:
    """Keys and values kept between decoding steps, (B, Hkv, T, D), grown in place.

    For self-attention each call appends the new positions; for cross-attention the encoder's
    keys and values are computed once and reused (``static``). Storage doubles when full, so
    appending a token costs O(1) amortised instead of a full copy.
    """

    def __init__(self) -> None:
        self._k: Tensor | None = None
        self._v: Tensor | None = None
        self.length = 0
        self.static = False

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new keys/values (B, Hkv, Tnew, D); return all of them so far (B, Hkv, T, D)."""
        t_new = k.shape[2]
        if self._k is None or self._v is None:
            capacity = max(16, 2 * t_new)
            self._k = k.new_empty(k.shape[0], k.shape[1], capacity, k.shape[3])
            self._v = v.new_empty(v.shape[0], v.shape[1], capacity, v.shape[3])
        elif self.length + t_new > self._k.shape[2]:
            capacity = max(2 * self._k.shape[2], self.length + t_new)
            self._k = _grow(self._k, capacity, self.length)
            self._v = _grow(self._v, capacity, self.length)
        end = self.length + t_new
        self._k[:, :, self.length : end] = k
        self._v[:, :, self.length : end] = v
        self.length = end
        return self.keys, self.values

    def set_static(self, k: Tensor, v: Tensor) -> None:
        """Store cross-attention keys/values that stay fixed for the whole decode."""
        self._k, self._v, self.length, self.static = k, v, k.shape[2], True

    @property
    def keys(self) -> Tensor:
        assert self._k is not None, "empty KVCache"
        return self._k[:, :, : self.length]  # (B, Hkv, T, D)

    @property
    def values(self) -> Tensor:
        assert self._v is not None, "empty KVCache"
        return self._v[:, :, : self.length]  # (B, Hkv, T, D)

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search): keep rows ``index`` (B',) of the batch."""
        if self._k is not None and self._v is not None:
            self._k = self._k.index_select(0, index)
            self._v = self._v.index_select(0, index)


def _grow(buffer: Tensor, capacity: int, used: int) -> Tensor:
    """Copy the used part of a cache buffer into a larger one."""
    bigger = buffer.new_empty(*buffer.shape[:2], capacity, buffer.shape[3])
    bigger[:, :, :used] = buffer[:, :, :used]
    return bigger


# --------------------------------------------------------------------------- multi-head


RotaryHook = Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]]


class AttentionKernel(Protocol):
    """Self-attention other than full softmax attention (``attnlab.layers.efficient`` builds them).

    Called with per-head q (B, H, Tq, D), k, v (B, Hkv, Tk, D) instead of
    :func:`scaled_dot_product_attention`; it owns its decoding cache (``new_cache``), which it
    updates itself when one is passed. Holds no parameters.
    """

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None,
        is_causal: bool,
        bias: Tensor | None,
        dropout_p: float,
        need_weights: bool,
        cache: Any,
    ) -> tuple[Tensor, Tensor | None]: ...

    def new_cache(self) -> Any: ...


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O  (Vaswani et al. 2017, §3.2.2).

    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V). Self-attention when ``context`` is None, else
    cross-attention over ``context`` (its length and width may differ from the query's).
    ``n_kv_heads`` < ``n_heads`` gives grouped-query attention (1 = multi-query).
    One projection layout for self- and cross-attention: ``q_proj`` maps x to the queries,
    ``kv_proj`` maps the source (x itself, or ``context``) to keys and values (rows: keys, then
    ``rotary`` is an optional hook ``(q, k, offset) -> (q, k)`` applied to the per-head queries
    and keys (RoPE); an additive ``bias`` passed to :meth:`forward` carries relative positions.
    ``kernel`` replaces full attention in self-attention (local or linear attention, from
    :func:`attnlab.layers.efficient.make_kernel`); the parameters, and so checkpoints, stay the
    same.
    ``backend`` says how full attention (self and cross) is computed: explicit, fused, matmul,
    flash or triton (:func:`scaled_dot_product_attention`).
    ``q_norm``/``k_norm`` (QK-norm, e.g. RMSNorm over Dh as in Qwen3) normalise each
    self-attention head's queries and keys before ``rotary``; ``forward(values=...)`` adds a
    tensor (B, Tq, Hkv*Dh) to the projected self-attention values (value embeddings).
    """

    is_attention = True  # attention_record.record_attention labels its calls with its name

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        rotary: RotaryHook | None = None,
        backend: Backend = "fused",
        kernel: AttentionKernel | None = None,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if head_dim is None and d_model % n_heads != 0:
            divisors = [h for h in range(1, d_model + 1) if d_model % h == 0 and h <= 64]
            raise ValueError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}; choose n_heads from "
                f"{divisors} or set head_dim explicitly"
            )
        if n_heads % n_kv_heads != 0:
            raise ValueError(
                f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads} "
                "(each key/value head serves n_heads / n_kv_heads query heads)"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if (kdim if kdim is not None else d_model) != (vdim if vdim is not None else d_model):
            raise ValueError(
                f"kdim={kdim} and vdim={vdim} differ, but one context tensor gives both keys and "
                "values; set vdim equal to kdim (or leave both None for d_model)"
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads if head_dim is None else head_dim
        self.kdim = d_model if kdim is None else kdim
        self.vdim = d_model if vdim is None else vdim
        self.dropout = dropout
        self.rotary = rotary
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.backend = backend
        self.kernel = kernel
        self.q_norm, self.k_norm = q_norm, k_norm
        q_width = n_heads * self.head_dim
        kv_width = n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, q_width, bias=bias)  # x -> queries
        self.kv_proj = nn.Linear(self.kdim, 2 * kv_width, bias=bias)  # source -> keys; values
        self.out_proj = nn.Linear(q_width, d_model, bias=bias)

    def _heads(self, t: Tensor, n: int) -> Tensor:
        """(B, T, n*Dh) -> (B, n, T, Dh)."""
        B, T, _ = t.shape
        return t.view(B, T, n, self.head_dim).transpose(1, 2)

    def _keys_values(self, source: Tensor) -> tuple[Tensor, Tensor]:
        """(B, Tk, kdim) -> keys, values (B, Tk, Hkv*Dh) each."""
        k, v = self.kv_proj(source).chunk(2, dim=-1)
        return k, v

    # -- forward

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        bias: Tensor | None = None,
        need_weights: bool = False,
        average_weights: bool = False,
        cache: KVCache | None = None,
        values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, Tq, d_model); context: (B, Tk, kdim) or None. Returns (B, Tq, d_model), weights.

        mask: bool, True = may attend: (Tq, Tk) shared, (B, Tq, Tk) per sample, or
        (B|1, H|1, Tq, Tk) per sample and head (:func:`normalize_mask`; anything else is
        refused). With ``cache`` the keys and values of earlier calls are reused: for
        self-attention the new positions are appended (the mask, if given, must cover all
        Tk = past + new keys); for cross-attention the context is projected once, on the first
        call. A query row with nothing to attend to gets zeros from attention, so its output
        is ``out_proj.bias`` (zeros without bias), as ``nn.MultiheadAttention`` gives on its
        fused path. Weights are (B, H, Tq, Tk), or (B, Tq, Tk) averaged over heads with
        ``average_weights``.
        """
        self._check_input(x, self.d_model, "x")
        B, Tq, _ = x.shape
        # Q W_i^Q, K W_i^K, V W_i^V for every head i at once: (B, H, Tq, Dh), (B, Hkv, Tk, Dh)
        if context is None:
            q, k, v = self._self_attention_inputs(x, cache, values)
        else:
            q, k, v = self._cross_attention_inputs(x, context, cache)
        # head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                   (B, H, Tq, Dh)
        out, weights = self._attend(q, k, v, mask, is_causal, bias, need_weights, cache)
        out = out.transpose(1, 2).reshape(B, Tq, self.n_heads * self.head_dim)  # Concat(head_i)
        out = self.out_proj(out)  # MultiHead = Concat(head_1..head_h) W^O   (B, Tq, d_model)
        if weights is not None and average_weights:
            weights = weights.mean(dim=1)  # (B, Tq, Tk)
        return out, weights

    def _self_attention_inputs(
        self, x: Tensor, cache: Any, values: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of x (B, H|Hkv, T, Dh): value embeddings added, QK-norm,
        RoPE at the cache's offset; a KV cache gets the new keys and values and gives back all
        of them (a kernel's own cache is updated by the kernel)."""
        k, v = self._keys_values(x)  # (B, T, Hkv*Dh) each
        if values is not None:
            v = v + values  # (B, T, Hkv*Dh)
        q = self._heads(self.q_proj(x), self.n_heads)  # (B, H, T, Dh)
        k, v = self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)  # (B, Hkv, T, Dh)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # per head, over Dh
        if self.rotary is not None:
            q, k = self.rotary(q, k, 0 if cache is None else cache.length)
        if cache is not None and self.kernel is None:
            k, v = cache.append(k, v)  # (B, Hkv, past + T, Dh)
        return q, k, v

    def _cross_attention_inputs(
        self, x: Tensor, context: Tensor, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries of x, keys and values of ``context`` (B, H|Hkv, T, Dh); with a cache the
        context is projected on the first call only and its keys and values kept."""
        if self.kernel is not None:
            raise ValueError(
                f"{self.kernel!r} is self-attention only; build cross-attention with kernel=None"
            )
        q = self._heads(self.q_proj(x), self.n_heads)  # (B, H, Tq, Dh)
        if cache is not None and cache.static:
            return q, cache.keys, cache.values  # (B, Hkv, Tk, Dh)
        self._check_input(context, self.kdim, "context")
        k, v = (self._heads(t, self.n_kv_heads) for t in self._keys_values(context))
        if cache is not None:
            cache.set_static(k, v)
        return q, k, v  # (B, Hkv, Tk, Dh)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        bias: Tensor | None,
        need_weights: bool,
        cache: Any,
    ) -> tuple[Tensor, Tensor | None]:
        """The one place the attention is chosen: the module's ``kernel`` (local or linear
        attention), else scaled dot-product attention computed by ``backend``."""
        dropout_p = self.dropout if self.training else 0.0
        if self.kernel is not None:
            return self.kernel(
                q, k, v, mask=mask, is_causal=is_causal, bias=bias, dropout_p=dropout_p,
                need_weights=need_weights, cache=cache,
            )  # fmt: skip
        # One new query against a cache sees every key: no causal mask needed.
        causal = is_causal and not (cache is not None and q.shape[2] == 1)
        return scaled_dot_product_attention(
            q, k, v, mask=mask, is_causal=causal, dropout_p=dropout_p,
            need_weights=need_weights, bias=bias, backend=self.backend,
        )  # fmt: skip  # (B, H, Tq, Dh)

    def new_cache(self) -> Any:
        """An empty decoding cache for this layer's self-attention (KVCache for full attention)."""
        return KVCache() if self.kernel is None else self.kernel.new_cache()

    @staticmethod
    def _check_input(t: Tensor, width: int, name: str) -> None:
        if not t.is_floating_point():
            raise ValueError(
                f"{name} must be a floating tensor of shape (B, T, {width}), got dtype {t.dtype}; "
                "token ids go through an embedding layer first"
            )
        if t.dim() != 3 or t.shape[-1] != width:
            raise ValueError(f"{name} must have shape (B, T, {width}), got {tuple(t.shape)}")
