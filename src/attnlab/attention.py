"""Scaled dot-product attention, attention masks, multi-head attention and its KV cache.

Mask convention, one for all of attnlab: a **boolean** tensor where ``True`` means *may
attend*, read by one rule for every rank (:func:`normalize_mask`; any dimension may also be 1):

* 2-D ``(Tq, Tk)``: one mask shared by every sample and head;
* 3-D ``(B, Tq, Tk)``: one mask per sample, shared by the heads;
* 4-D ``(B, H, Tq, Tk)``: per sample and per head (a key padding mask is (B, 1, 1, Tk));

for inputs with more leading dimensions (…, Tq, D), a mask of the inputs' rank. Any other rank,
or a size that is neither the input's nor 1, is refused with a message saying how to reshape:
nothing is guessed (a 3-D mask is never read as one mask per head). PyTorch's
``key_padding_mask`` and boolean ``attn_mask`` of ``nn.MultiheadAttention`` use the opposite
sense (``True`` = ignore); convert them at the boundary with :func:`from_key_padding_mask` and
:func:`from_attn_mask`.

A query row with nothing to attend to yields an attention output of zeros (and zero
gradients), never NaN, as ``F.scaled_dot_product_attention`` does; :class:`MultiHeadAttention`
then applies ``out_proj`` as usual, so its output for that row is ``out_proj.bias`` (what
``nn.MultiheadAttention`` returns on its fused path).

Causal masks are aligned bottom-right: with Tq queries and Tk keys, query ``i`` sits at
position ``Tk - Tq + i``. For Tq == Tk this is the usual lower triangle; for a KV cache it lets
the new queries see every cached key and each other causally.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Global switch: when False, every call takes the explicit path (for inspection and teaching).
USE_FUSED = True


class explicit_attention:  # noqa: N801 - used as a context manager, reads like a statement
    """Context manager that forces the explicit (step-by-step) attention path everywhere."""

    def __enter__(self) -> None:
        global USE_FUSED
        self._previous = USE_FUSED
        USE_FUSED = False

    def __exit__(self, *exc: object) -> None:
        global USE_FUSED
        USE_FUSED = self._previous


@dataclass
class AttentionCall:
    """One call of :func:`scaled_dot_product_attention`, as :class:`record_attention` saw it.

    ``weights = softmax(scores · scale + bias, masked)`` with ``scores`` the raw q·kᵀ (not yet
    scaled by 1/√d_k), all (B, H, Tq, Tk); ``mask`` (True = may attend) includes the causal part
    when ``is_causal``; ``module`` names the MultiHeadAttention that made the call.
    """

    module: str
    scores: Tensor
    scale: float
    bias: Tensor | None
    mask: Tensor | None
    is_causal: bool
    weights: Tensor


_RECORDER: record_attention | None = None


class record_attention:  # noqa: N801 - used as a context manager, reads like a statement
    """While active, every attention call takes the explicit path and is appended to ``calls``.

    With ``model``, each call is labelled with the name of the MultiHeadAttention in ``model``
    that made it (``model.named_modules()`` names). One recorder at a time.
    """

    def __init__(self, model: nn.Module | None = None) -> None:
        self.model = model
        self.calls: list[AttentionCall] = []
        self._module = ""
        self._hooks: list[Any] = []

    def __enter__(self) -> record_attention:
        global _RECORDER
        if _RECORDER is not None:
            raise ValueError(
                "an attention recorder is already active; exit it before starting another"
            )
        for name, module in self.model.named_modules() if self.model is not None else []:
            if isinstance(module, MultiHeadAttention) or getattr(module, "is_attention", False):
                self._hooks.append(module.register_forward_pre_hook(self._enter_module(name)))
        _RECORDER = self
        return self

    def _enter_module(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            self._module = name

        return hook

    def __exit__(self, *exc: object) -> None:
        global _RECORDER
        _RECORDER = None
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def is_recording() -> bool:
    """Whether a :class:`record_attention` is active (kernels then take their full-matrix path)."""
    return _RECORDER is not None


def record_mixer_weights(weights: Tensor) -> None:
    """Give the active recorder the attention a causal sequence mixer computes implicitly.

    weights (B, H, T, T), each row a distribution over positions <= its own (RWKV's wkv, the
    normalised hidden attention of Mamba): recorded as a causal call whose scores are the
    log-weights at scale 1, so softmax(scores) gives the weights back. No-op without a recorder.
    """
    if _RECORDER is None:
        return
    T = weights.shape[-1]
    causal = causal_mask(T, T, device=weights.device)  # (T, T)
    scores = weights.clamp_min(torch.finfo(weights.dtype).tiny).log().masked_fill(~causal, 0.0)
    _RECORDER.calls.append(
        AttentionCall(_RECORDER._module, scores, 1.0, None, causal, True, weights)
    )


def channel_groups(per_channel: Tensor, groups: int) -> Tensor:
    """(B, D, T, T) per-channel weights -> (B, G, T, T), the mean over each group of D / G
    consecutive channels (G = ``groups`` when it divides D, else 1): a mixer's "heads" to show."""
    B, D, T, _ = per_channel.shape
    G = groups if groups > 0 and D % groups == 0 else 1
    return per_channel.reshape(B, G, D // G, T, T).mean(dim=2)


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


def _check_mask(mask: Tensor, target: tuple[int, ...]) -> Tensor:
    """A boolean ``mask`` read by :func:`normalize_mask`, else a clear ValueError."""
    if mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be a bool tensor (True = may attend), got {mask.dtype}; convert PyTorch "
            "masks with from_attn_mask / from_key_padding_mask, or pass an additive float as bias="
        )
    return normalize_mask(mask, target)


# --------------------------------------------------------------------------- attention


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
    fused: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + bias, masked) V  (Vaswani et al. 2017, eq. 1).

    q: (…, Tq, Dk); k: (…, Tk, Dk); v: (…, Tk, Dv) with any leading dimensions, as
    ``F.scaled_dot_product_attention``: typically (B, H, T, D), or (B, T, D) for one head.
    With four or more dimensions the third from the end is the head dimension and k, v may have
    fewer heads Hkv than q's H, H a multiple of Hkv (grouped-query attention shares each
    key/value head among H / Hkv query heads); every other leading dimension must agree.
    mask: bool, True = may attend, read by the rule of :func:`normalize_mask` (2-D (Tq, Tk)
    shared, 3-D (B, Tq, Tk) per sample, or q's rank). bias: additive float scores (relative
    position bias, ALiBi), read by the same rule. Returns (output (…, Tq, Dv), weights
    (…, Tq, Tk) or None). ``fused`` (here and on :class:`MultiHeadAttention`): PyTorch's fused
    kernel may run; it does unless weights are asked for, attention is being recorded
    (:class:`record_attention`) or :class:`explicit_attention` is on. Both paths give the same
    numbers.
    """
    n = q.dim()
    if n < 2 or k.dim() != n or v.dim() != n:
        raise ValueError(
            "q, k, v must have the same number of dimensions (…, T, D), at least 2, e.g. "
            f"(B, H, T, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.is_floating_point() and k.is_floating_point() and v.is_floating_point()):
        raise ValueError(f"q, k, v must be floating point, got {q.dtype}, {k.dtype}, {v.dtype}")
    outer = 3 if n >= 4 else 2  # the leading dimensions that must agree (heads may differ)
    same_outer = q.shape[:-outer] == k.shape[:-outer] == v.shape[:-outer]
    if not same_outer or k.shape[-2] != v.shape[-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(
            "q (…, Tq, Dk), k (…, Tk, Dk), v (…, Tk, Dv) must agree in their leading dimensions "
            f"(all but the heads), k and v in length, q and k in width; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    target = (*q.shape[:-1], k.shape[-2])  # (…, Tq, Tk)
    if mask is not None:
        mask = _check_mask(mask, target)
    if bias is not None:
        bias = normalize_mask(bias, target, name="bias")
    if n == 4:
        return _attention_4d(q, k, v, mask, is_causal, dropout_p, need_weights, bias, scale, fused)
    q4, k4, v4 = (_as_4d(t, n) for t in (q, k, v))  # (N, H, T, D)
    mask4, bias4 = (None if t is None else _as_4d(t, n, q.shape[:-3]) for t in (mask, bias))
    out, weights = _attention_4d(
        q4, k4, v4, mask4, is_causal, dropout_p, need_weights, bias4, scale, fused
    )  # (N, H, Tq, Dv), (N, H, Tq, Tk)
    out = out.reshape(*q.shape[:-1], v.shape[-1])  # (…, Tq, Dv)
    return out, None if weights is None else weights.reshape(target)  # (…, Tq, Tk)


def _as_4d(t: Tensor, n: int, outer: tuple[int, ...] | None = None) -> Tensor:
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


def _attention_4d(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    dropout_p: float,
    need_weights: bool,
    bias: Tensor | None,
    scale: float | None,
    fused: bool,
) -> tuple[Tensor, Tensor | None]:
    """:func:`scaled_dot_product_attention` on (B, H, T, D) inputs, masks already read."""
    B, H, Tq, Dk = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if H % Hkv != 0 or v.shape[1] != Hkv:
        raise ValueError(
            f"query heads ({H}) must be a multiple of key/value heads (k: {Hkv}, v: {v.shape[1]})"
        )
    scale = 1.0 / math.sqrt(Dk) if scale is None else scale
    use_fused = fused and USE_FUSED and not need_weights and _RECORDER is None
    given_causal = is_causal
    if use_fused and is_causal and mask is None and bias is None and Tq == Tk:
        # Bottom-right and top-left alignment agree when Tq == Tk: let the kernel apply the
        # causal structure itself (it skips the blocks above the diagonal) instead of reading
        # a materialised (Tq, Tk) mask.
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale, enable_gqa=Hkv != H
        )  # (B, H, Tq, Dv)
        return out, None
    if is_causal:
        mask = combine_masks(mask, causal_mask(Tq, Tk, device=q.device))

    if use_fused:
        return _fused_attention(q, k, v, mask, bias, dropout_p, scale), None

    if Hkv != H:  # share each key/value head among H / Hkv query heads
        k = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, Tk, Dk)
        v = v.repeat_interleave(H // Hkv, dim=1)  # (B, H, Tk, Dv)
    raw = torch.matmul(q, k.transpose(-2, -1))  # (B, H, Tq, Tk) q·kᵀ, unscaled
    scores = raw * scale  # (B, H, Tq, Tk)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        # The dtype's lowest finite value instead of -inf: a fully masked row then softmaxes to a
        # harmless uniform row (no NaN), which the multiplication below turns into zeros.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (B, H, Tq, Tk)
    if mask is not None:
        weights = weights * mask  # rows with nothing to attend to become all zeros
    if _RECORDER is not None:
        _RECORDER.calls.append(
            AttentionCall(_RECORDER._module, raw, scale, bias, mask, given_causal, weights)
        )
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = torch.matmul(weights, v)  # (B, H, Tq, Dv)
    return out, weights


def _fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    dropout_p: float,
    scale: float,
) -> Tensor:
    """PyTorch's fused kernel with attnlab's conventions (mask sense, zero rows, GQA)."""
    H, Hkv = q.shape[1], k.shape[1]
    attn_mask: Tensor | None = mask
    if bias is not None:
        attn_mask = bias if mask is None else torch.where(mask, bias, float("-inf"))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=Hkv != H
    )  # (B, H, Tq, Dv)
    if bias is not None and mask is not None:
        # With a float mask the kernel cannot tell "blocked" from "very unlikely": zero the rows
        # that attend to nothing so they match the explicit path.
        any_key = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, Tq|1, 1)
        out = out.masked_fill(~any_key, 0.0)
    return out


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
    """Self-attention other than full softmax attention (``attnlab.efficient`` builds them).

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
    values). Weights saved in the older layouts (one packed ``qkv``, or ``k_proj``/``v_proj``)
    are read into it on load (:meth:`upgrade_tensors`).
    ``rotary`` is an optional hook ``(q, k, offset) -> (q, k)`` applied to the per-head queries
    and keys (RoPE); an additive ``bias`` passed to :meth:`forward` carries relative positions.
    ``kernel`` replaces full attention in self-attention (local or linear attention, from
    :func:`attnlab.efficient.make_kernel`); the parameters, and so checkpoints, stay the same.
    ``q_norm``/``k_norm`` (QK-norm, e.g. RMSNorm over Dh as in Qwen3) normalise each
    self-attention head's queries and keys before ``rotary``; ``forward(values=...)`` adds a
    tensor (B, Tq, Hkv*Dh) to the projected self-attention values (value embeddings).
    """

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
        fused: bool = True,
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
        self.fused = fused
        self.kernel = kernel
        self.q_norm, self.k_norm = q_norm, k_norm
        q_width = n_heads * self.head_dim
        kv_width = n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, q_width, bias=bias)  # x -> queries
        self.kv_proj = nn.Linear(self.kdim, 2 * kv_width, bias=bias)  # source -> keys; values
        self.out_proj = nn.Linear(q_width, d_model, bias=bias)
        self._register_load_state_dict_pre_hook(self._read_old_layout)

    def upgrade_tensors(self, tensors: dict[str, Tensor], prefix: str) -> None:
        """Rewrite in place weights saved in the layouts before ``q_proj`` + ``kv_proj``: one
        packed ``qkv`` (rows: queries, keys, values), or ``q_proj``, ``k_proj``, ``v_proj``."""
        for kind in ("weight", "bias"):
            packed = tensors.pop(f"{prefix}qkv.{kind}", None)
            if packed is not None:
                q, kv = packed.split((self.q_proj.out_features, self.kv_proj.out_features))
                tensors[f"{prefix}q_proj.{kind}"], tensors[f"{prefix}kv_proj.{kind}"] = q, kv
            k, v = (
                tensors.pop(f"{prefix}k_proj.{kind}", None),
                tensors.pop(f"{prefix}v_proj.{kind}", None),
            )
            if k is not None and v is not None:
                tensors[f"{prefix}kv_proj.{kind}"] = torch.cat([k, v])

    def _read_old_layout(self, state_dict: dict[str, Tensor], prefix: str, *_: Any) -> None:
        self.upgrade_tensors(state_dict, prefix)

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
        if context is None:
            q, k, v = self._self_attention_inputs(x, cache, values)
        else:
            q, k, v = self._cross_attention_inputs(x, context, cache)
        out, weights = self._attend(q, k, v, mask, is_causal, bias, need_weights, cache)
        out = out.transpose(1, 2).reshape(B, Tq, self.n_heads * self.head_dim)  # (B, Tq, H*Dh)
        out = self.out_proj(out)  # (B, Tq, d_model)
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
        """The one place the attention kernel is chosen: the module's ``kernel`` (local or
        linear attention), else scaled dot-product attention (PyTorch's fused kernel when
        ``fused`` and no weights are asked for, else the explicit path)."""
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
            need_weights=need_weights, bias=bias, fused=self.fused,
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
