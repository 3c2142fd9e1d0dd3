"""Attention for long sequences: sliding-window (local) attention and linear attention.

Both are *kernels*: they take per-head q, k, v (B, H, T, D) like
:func:`attnlab.layers.attention.scaled_dot_product_attention` and plug into
:class:`attnlab.layers.attention.MultiHeadAttention` through its ``kernel`` argument (they hold no
parameters, so checkpoints are the same as with full attention). :func:`make_kernel` builds one
from the config switch ``attention = "full" | "local" | "linear"``: *what* is computed. *How*
full attention is computed (explicit, fused, matmul, flash, triton) is the separate ``backend``
switch of :func:`attnlab.layers.attention.scaled_dot_product_attention`; local and linear
attention compute their own way and take only the default backend.

**Local attention** (sliding window; Child et al. 2019 §4, Beltagy et al. 2020 "Longformer"
§3.1). With ``window = w`` a query at position i sees the keys j with 0 ≤ i − j < w when causal
(itself and the w − 1 before it) and |i − j| < w otherwise; the first ``n_global`` positions
are *global* (Longformer §3.1): they see every key and every query sees them (causality still
holds). The blocked path cuts the queries into blocks and gives each block only the slab of
keys its window reaches, so time and memory grow as T·w instead of T². For decoding,
:class:`SlidingWindowCache` keeps only the global keys and the last w − 1 keys.

**Linear attention** (Katharopoulos et al. 2020, "Transformers are RNNs"). With the feature
map φ(x) = elu(x) + 1 (eq. 7), softmax(QKᵀ)V is replaced by

    V'_i = φ(Q_i)ᵀ Σ_j φ(K_j) V_jᵀ / φ(Q_i)ᵀ Σ_j φ(K_j)                        (eq. 5)

and causally, with S_i = Σ_{j≤i} φ(K_j) V_jᵀ and Z_i = Σ_{j≤i} φ(K_j),

    V'_i = φ(Q_i)ᵀ S_i / φ(Q_i)ᵀ Z_i                                           (eqs. 8-10)

which is an RNN over (S, Z) (eqs. 16-20): :class:`LinearAttentionState` carries them between
decoding steps. The causal parallel form here is chunked: exact attention inside chunks of
``chunk`` positions and the running sums across them, O(T·chunk + T·D²) work. There is no
1/√d scale (the paper applies φ to the raw projections), no additive bias, and the only mask
it can express is one over keys (padding), which removes φ(K_j) from the sums.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.errors import UserError
from attnlab.layers.attention import (
    BACKENDS,
    AttentionKernel,
    combine_masks,
    scaled_dot_product_attention,
)
from attnlab.layers.attention_record import is_recording
from attnlab.layers.shapes import normalize_mask

AttentionKind = Literal["full", "local", "linear"]
ATTENTION_KINDS: tuple[str, ...] = get_args(AttentionKind)
BACKEND_HELP = (
    "how full attention is computed: fused (PyTorch's kernel) | explicit (the textbook steps, "
    "T×T weights) | matmul (batched products, float32 softmax: short rows on the CPU) | flash "
    "(attnlab's tiled FlashAttention) | triton (its Triton forward, CUDA)"
)


def check_attention_config(
    attention: str, window: int, n_global: int, backend: str = "fused"
) -> None:
    """Raise a UserError naming the field and the fix for a bad attention switch."""
    if attention not in ATTENTION_KINDS:
        raise UserError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, got {attention!r}")
    if backend not in BACKENDS:
        raise UserError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if attention != "full" and backend != "fused":
        raise UserError(
            f"backend={backend!r} applies to attention='full'; {attention} attention computes "
            "its own way: drop backend or set attention='full'"
        )
    if n_global < 0:
        raise UserError(f"n_global must be >= 0, got {n_global}")
    if attention == "local" and window < 1:
        raise UserError(
            f"attention='local' needs window >= 1 (how many keys back each query sees, itself "
            f"included), got window={window}; set e.g. --window 64"
        )
    if attention != "local" and (window or n_global):
        raise UserError(
            f"window={window} and n_global={n_global} only apply to attention='local', but "
            f"attention={attention!r}; drop them or set attention='local'"
        )


def make_kernel(attention: str, window: int = 0, n_global: int = 0) -> AttentionKernel | None:
    """The kernel for a config switch: None for full attention (the MHA's own path)."""
    check_attention_config(attention, window, n_global)
    if attention == "local":
        return LocalAttention(window, n_global)
    if attention == "linear":
        return LinearAttention()
    return None


def _repeat_kv(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Grouped-query attention: share each of Hkv key/value heads among H / Hkv query heads."""
    H, Hkv = q.shape[1], k.shape[1]
    if H % Hkv != 0:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({Hkv})")
    if Hkv == H:
        return k, v
    return k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)


def _read_masks(
    mask: Tensor | None, bias: Tensor | None, q: Tensor, t_k: int
) -> tuple[Tensor | None, Tensor | None]:
    """Mask and bias read by attnlab's one rule (``normalize_mask``) as (B|1, H|1, Tq|1, Tk|1)."""
    target = (q.shape[0], q.shape[1], q.shape[2], t_k)  # (B, H, Tq, Tk)
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor (True = may attend), got {mask.dtype}")
        mask = normalize_mask(mask, target)
    if bias is not None:
        bias = normalize_mask(bias, target, name="bias")
    return mask, bias


def _key_mask(mask: Tensor | None, B: int, Tk: int) -> Tensor | None:
    """A mask over keys only, as (B|1, 1|H, 1, Tk); None if ``mask`` is None or not over keys."""
    if mask is None:
        return None
    if mask.dim() != 4 or mask.shape[2] != 1 or mask.shape[-1] != Tk or mask.shape[0] not in (1, B):
        return None
    return mask


# --------------------------------------------------------------------------- local


def band_mask(q_pos: Tensor, k_pos: Tensor, window: int, causal: bool, n_global: int = 0) -> Tensor:
    """Sliding-window mask (1, 1, Tq, Tk) from absolute positions (Tq,), (Tk,); True = may attend.

    Causal: 0 <= i - j < window; else |i - j| < window. Keys and queries at positions below
    ``n_global`` are global: they attend to, and are attended by, every position (causal: only
    earlier or equal ones).
    """
    d = q_pos[:, None] - k_pos[None, :]  # (Tq, Tk) i - j
    near = (d < window) & (d >= 0) if causal else d.abs() < window
    glob = (q_pos[:, None] < n_global) | (k_pos[None, :] < n_global)
    if causal:
        glob = glob & (d >= 0)
    return (near | glob)[None, None]  # (1, 1, Tq, Tk)


class SlidingWindowCache:
    """Decoding cache of local attention: the global keys and the last ``window - 1`` keys.

    That is all a new query can see (itself being the window's last key), so memory stays
    constant however long the decode runs. ``length`` counts every position seen (the offset
    of the next one, for positions and RoPE), not the keys kept.
    """

    def __init__(self, window: int, n_global: int = 0) -> None:
        self.window = window
        self.n_global = n_global
        self.length = 0
        self._k: Tensor | None = None  # (B, Hkv, kept, D)
        self._v: Tensor | None = None
        self._pos: Tensor | None = None  # (kept,) absolute positions of the kept keys

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Add new keys/values (B, Hkv, Tnew, D); return those the new queries may need and
        their absolute positions (Tk,). Then drop every key no later query can see."""
        start = self.length
        positions = torch.arange(start, start + k.shape[2], device=k.device)  # (Tnew,)
        keys, values = k, v
        if self._k is not None and self._v is not None and self._pos is not None:
            keys = torch.cat([self._k, k], dim=2)  # (B, Hkv, kept + Tnew, D)
            values = torch.cat([self._v, v], dim=2)
            positions = torch.cat([self._pos, positions])  # (kept + Tnew,)
        self.length = start + k.shape[2]
        # The next query sits at `length` and sees keys > length - window, and the global ones.
        keep = (positions < self.n_global) | (positions > self.length - self.window)
        self._k, self._v, self._pos = keys[:, :, keep], values[:, :, keep], positions[keep]
        return keys, values, positions

    @property
    def kept(self) -> int:
        """Number of keys held (at most n_global + window - 1)."""
        return 0 if self._k is None else self._k.shape[2]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',), as beam search or finished samples need."""
        if self._k is not None and self._v is not None:
            self._k = self._k.index_select(0, index)
            self._v = self._v.index_select(0, index)


class LocalAttention:
    """Sliding-window attention with optional global tokens (see the module docstring)."""

    def __init__(self, window: int, n_global: int = 0, block: int = 64) -> None:
        check_attention_config("local", window, n_global)
        self.window = window
        self.n_global = n_global
        self.block = block

    def __repr__(self) -> str:
        return f"LocalAttention(window={self.window}, n_global={self.n_global})"

    def new_cache(self) -> SlidingWindowCache:
        return SlidingWindowCache(self.window, self.n_global)

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        bias: Tensor | None = None,
        dropout_p: float = 0.0,
        need_weights: bool = False,
        cache: SlidingWindowCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """q (B, H, Tq, D), k, v (B, Hkv, Tk, D) -> (B, H, Tq, D), weights (B, H, Tq, Tk) or None.

        Blocked O(T·w) path when Tq == Tk, no cache, no bias, no weights asked for and the mask
        (if any) is over keys only; otherwise the band mask is built in full and combined with
        ``mask`` for :func:`scaled_dot_product_attention` (same numbers, O(Tq·Tk)).
        """
        Tq = q.shape[2]
        if cache is not None:
            if not isinstance(cache, SlidingWindowCache):
                raise ValueError(
                    "local attention decodes with a SlidingWindowCache, got "
                    f"{type(cache).__name__}; build caches with the model's new_caches()"
                )
            if not is_causal:
                raise ValueError("a decoding cache needs causal attention (is_causal=True)")
            k, v, k_pos = cache.append(k, v)  # (B, Hkv, Tk, D), (Tk,)
            q_pos = torch.arange(cache.length - Tq, cache.length, device=q.device)
            mask, bias = _read_masks(mask, bias, q, cache.length)
            # A mask or bias covers every position seen, as with a KVCache: keep the columns
            # of the keys still held.
            if bias is not None and bias.shape[-1] > 1:
                bias = bias.index_select(-1, k_pos)
            if mask is not None and mask.shape[-1] > 1:
                mask = mask.index_select(-1, k_pos)
        else:
            Tk = k.shape[2]
            if is_causal and Tk < Tq:
                raise ValueError(f"causal attention needs Tk >= Tq, got Tq={Tq}, Tk={Tk}")
            k_pos = torch.arange(Tk, device=q.device)
            q_pos = torch.arange(Tk - Tq, Tk, device=q.device)  # bottom-right aligned
            mask, bias = _read_masks(mask, bias, q, Tk)
        key_mask = _key_mask(mask, q.shape[0], k.shape[2])
        blocked = (
            cache is None
            and Tq == k.shape[2]
            and bias is None
            and not need_weights
            and not is_recording()  # a recorder reads the full (Tq, Tk) weights
            and (mask is None or key_mask is not None)
        )
        if blocked:
            out = local_attention_blocked(
                q, k, v, self.window, is_causal, self.n_global, key_mask, dropout_p, self.block
            )
            return out, None
        band = band_mask(q_pos, k_pos, self.window, is_causal, self.n_global)  # (1, 1, Tq, Tk)
        return scaled_dot_product_attention(
            q,
            k,
            v,
            mask=combine_masks(band, mask),
            dropout_p=dropout_p,
            need_weights=need_weights,
            bias=bias,
        )


def local_attention_blocked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    causal: bool,
    n_global: int = 0,
    key_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    block: int = 64,
) -> Tensor:
    """Sliding-window attention in O(T·(b + 2w)) time and memory, for Tq == Tk == T.

    Queries are cut into blocks of b = max(block, window) rows; block n (rows nb..nb+b-1) sees
    the slab of keys nb-w+1 .. nb+b-1 (causal) or .. nb+b+w-2 (bidirectional), built without
    copying by ``unfold`` over keys padded with w-1 zeros at each end; the band mask inside the
    slab is the same for every block. Global keys are a separate small score matrix; global
    query rows are recomputed densely against all keys. q (B, H, T, D) -> (B, H, T, Dv).
    """
    B, H, T, D = q.shape
    k, v = _repeat_kv(q, k, v)
    w = window
    b = min(max(block, w), T)
    n = math.ceil(T / b)
    lo = w - 1  # keys padded in front
    slab = b + lo + (0 if causal else w - 1)
    hi = n * b - T + (0 if causal else w - 1)  # keys padded at the back
    scale = 1.0 / math.sqrt(D)

    q_blocks = F.pad(q, (0, 0, 0, n * b - T)).view(B, H, n, b, D)  # (B, H, n, b, D)
    k_slabs = F.pad(k, (0, 0, lo, hi)).unfold(2, slab, b)  # (B, H, n, D, slab)
    v_slabs = F.pad(v, (0, 0, lo, hi)).unfold(2, slab, b).transpose(-1, -2)  # (B, H, n, slab, D)
    scores = torch.matmul(q_blocks, k_slabs) * scale  # (B, H, n, b, slab)

    # Absolute key position of slab column s in block m: m·b - lo + s; query row r: m·b + r.
    r = torch.arange(b, device=q.device)
    s = torch.arange(slab, device=q.device)
    d = r[:, None] - s[None, :] + lo  # (b, slab) i - j, the same in every block
    allowed = ((d >= 0) & (d < w)) if causal else (d.abs() < w)  # (b, slab)
    j = torch.arange(n, device=q.device)[:, None] * b - lo + s[None, :]  # (n, slab)
    real = (j >= n_global) & (j < T)  # global keys are scored separately below
    allowed = allowed[None] & real[:, None, :]  # (n, b, slab)
    if key_mask is not None:  # (B|1, 1|H, 1, T) -> (B|1, 1|H, n, 1, slab)
        km = F.pad(key_mask[:, :, 0], (lo, hi), value=False).unfold(2, slab, b)[:, :, :, None]
        allowed = allowed & km
    else:
        allowed = allowed[None, None]

    g = min(n_global, T)
    if g:
        glob_scores = (
            torch.matmul(q_blocks, k[:, :, None, :g].transpose(-1, -2)) * scale
        )  # (B,H,n,b,g)
        i = torch.arange(n, device=q.device)[:, None] * b + r[None, :]  # (n, b)
        g_allowed = (
            (torch.arange(g, device=q.device)[None, None, :] <= i[..., None])
            if causal
            else torch.ones(n, b, g, dtype=torch.bool, device=q.device)
        )  # (n, b, g)
        g_allowed = g_allowed[None, None]
        if key_mask is not None:
            g_allowed = g_allowed & key_mask[:, :, :, None, :g]  # (B|1, 1|H, n, b, g)
        scores = torch.cat([glob_scores, scores], dim=-1)  # (B, H, n, b, g + slab)
        allowed = torch.cat([g_allowed.expand(*allowed.shape[:-1], g), allowed], dim=-1)

    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1) * allowed  # empty rows -> zeros
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = torch.matmul(weights[..., g:], v_slabs)  # (B, H, n, b, D)
    if g:
        out = out + torch.matmul(weights[..., :g], v[:, :, None, :g])
    out = out.reshape(B, H, n * b, v.shape[-1])[:, :, :T]  # (B, H, T, Dv)
    if g:  # global queries see every key (causally: every earlier one)
        rows = torch.arange(g, device=q.device)[:, None]  # (g, 1)
        g_rows = (torch.arange(T, device=q.device)[None, :] <= rows)[None, None] if causal else None
        g_mask = combine_masks(key_mask, g_rows)  # (B|1, 1|H, g|1, T)
        g_out, _ = scaled_dot_product_attention(
            q[:, :, :g], k, v, mask=g_mask, dropout_p=dropout_p
        )  # (B, H, g, Dv)
        out = torch.cat([g_out, out[:, :, g:]], dim=2)
    return out


# --------------------------------------------------------------------------- linear


def elu_feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 (Katharopoulos et al. 2020, eq. 7): positive, so every similarity is."""
    return F.elu(x) + 1.0


class LinearAttentionState:
    """The RNN state of causal linear attention (eqs. 18-19): S = Σ φ(K_j) V_jᵀ, z = Σ φ(K_j).

    Constant size (B, H, D, Dv) and (B, H, D) whatever the length decoded; ``length`` counts
    the positions seen (the offset of the next one).
    """

    def __init__(self) -> None:
        self.S: Tensor | None = None
        self.z: Tensor | None = None
        self.length = 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',)."""
        if self.S is not None and self.z is not None:
            self.S, self.z = self.S.index_select(0, index), self.z.index_select(0, index)


class LinearAttention:
    """Linear attention with φ = elu + 1 (see the module docstring)."""

    def __init__(self, chunk: int = 64) -> None:
        self.chunk = chunk

    def __repr__(self) -> str:
        return "LinearAttention(feature_map=elu+1)"

    def new_cache(self) -> LinearAttentionState:
        return LinearAttentionState()

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        bias: Tensor | None = None,
        dropout_p: float = 0.0,
        need_weights: bool = False,
        cache: LinearAttentionState | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """q (B, H, Tq, D), k, v (B, Hkv, Tk, D) -> (B, H, Tq, Dv), implied weights or None.

        Computed in float32 at least (running sums in bf16 lose the small terms). Dropout does
        not apply (there is no weight matrix to drop from). With ``need_weights`` the implied
        weights φ(Q_i)ᵀφ(K_j) / Σ_j φ(Q_i)ᵀφ(K_j) are built in full, for inspection.
        """
        if bias is not None:
            raise ValueError(
                "linear attention cannot add a position bias to its scores (there are none); "
                "use pos='learned', 'sinusoidal' or 'rope' with attention='linear'"
            )
        B, Tq, Tk = q.shape[0], q.shape[2], k.shape[2]
        mask, _ = _read_masks(mask, None, q, Tk)
        key_mask = _key_mask(mask, B, Tk)
        if mask is not None and key_mask is None:
            raise ValueError(
                f"linear attention can only mask keys (padding), shape (B, 1, 1, Tk); got a mask "
                f"of shape {tuple(mask.shape)}; causality is is_causal=True"
            )
        k, v = _repeat_kv(q, k, v)
        dtype = q.dtype
        work = torch.promote_types(dtype, torch.float32)
        phi_q = elu_feature_map(q.to(work))  # (B, H, Tq, D)
        phi_k = elu_feature_map(k.to(work))  # (B, H, Tk, D)
        v = v.to(work)
        if key_mask is not None:
            phi_k = phi_k * key_mask[:, :, 0, :, None]  # masked keys leave the sums
        if cache is not None:
            if not isinstance(cache, LinearAttentionState):
                raise ValueError(
                    f"linear attention decodes with a LinearAttentionState, got "
                    f"{type(cache).__name__}; build caches with the model's new_caches()"
                )
            if not is_causal:
                raise ValueError("a decoding state needs causal attention (is_causal=True)")
            out = linear_attention_recurrent(phi_q, phi_k, v, cache)
            return out.to(dtype), None
        if need_weights:
            return _linear_with_weights(phi_q, phi_k, v, is_causal, dtype)
        if is_causal:
            if Tq != Tk:
                raise ValueError(f"causal linear attention needs Tq == Tk, got {Tq}, {Tk}")
            out = linear_attention_causal(phi_q, phi_k, v, self.chunk)
        else:
            S = torch.matmul(phi_k.transpose(-1, -2), v)  # (B, H, D, Dv)  Σ_j φ(K_j) V_jᵀ
            z = phi_k.sum(dim=2)  # (B, H, D)  Σ_j φ(K_j)
            num = torch.matmul(phi_q, S)  # (B, H, Tq, Dv)
            den = torch.matmul(phi_q, z[..., None])  # (B, H, Tq, 1)
            out = num / den.clamp_min(torch.finfo(work).tiny)  # no key at all -> 0 / tiny = 0
        return out.to(dtype), None


def _linear_with_weights(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, causal: bool, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """Eq. 2 with sim(q, k) = φ(q)ᵀφ(k), weights materialised: (B, H, Tq, Dv), (B, H, Tq, Tk)."""
    sim = torch.matmul(phi_q, phi_k.transpose(-1, -2))  # (B, H, Tq, Tk)
    if causal:
        Tq, Tk = sim.shape[-2:]
        sim = sim.tril(Tk - Tq)  # bottom-right aligned
    weights = sim / sim.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(sim.dtype).tiny)
    return torch.matmul(weights, v).to(dtype), weights.to(dtype)


def linear_attention_causal(phi_q: Tensor, phi_k: Tensor, v: Tensor, chunk: int = 64) -> Tensor:
    """Causal eqs. 8-10 in parallel, by chunks of c positions: (B, H, T, D) -> (B, H, T, Dv).

    Inside a chunk the similarities φ(Q)φ(K)ᵀ are masked to the lower triangle (c × c); the
    sums S and Z over all earlier chunks come from an exclusive cumulative sum of per-chunk
    sums. Memory O(T·c + (T/c)·D·Dv) instead of the (T, D, Dv) of a per-position cumsum.
    """
    B, H, T, D = phi_q.shape
    Dv = v.shape[-1]
    c = min(chunk, T)
    n = math.ceil(T / c)
    pad = n * c - T  # padded keys have φ = 0 and sit after every real query: no effect
    fq = F.pad(phi_q, (0, 0, 0, pad)).view(B, H, n, c, D)
    fk = F.pad(phi_k, (0, 0, 0, pad)).view(B, H, n, c, D)
    vc = F.pad(v, (0, 0, 0, pad)).view(B, H, n, c, Dv)
    kv = torch.matmul(fk.transpose(-1, -2), vc)  # (B, H, n, D, Dv) per-chunk Σ φ(K_j) V_jᵀ
    S = kv.cumsum(dim=2) - kv  # (B, H, n, D, Dv) sums over earlier chunks only
    zk = fk.sum(dim=3)  # (B, H, n, D)
    Z = zk.cumsum(dim=2) - zk  # (B, H, n, D)
    sim = torch.matmul(fq, fk.transpose(-1, -2)).tril()  # (B, H, n, c, c) j <= i in the chunk
    num = torch.matmul(fq, S) + torch.matmul(sim, vc)  # (B, H, n, c, Dv)
    den = torch.matmul(fq, Z[..., None]) + sim.sum(dim=-1, keepdim=True)  # (B, H, n, c, 1)
    out = num / den.clamp_min(torch.finfo(den.dtype).tiny)
    return out.reshape(B, H, n * c, Dv)[:, :, :T]


def linear_attention_recurrent(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, state: LinearAttentionState
) -> Tensor:
    """The RNN form (eqs. 16-20), one position at a time, updating ``state`` in place.

    s_i = s_{i-1} + φ(K_i) V_iᵀ;  z_i = z_{i-1} + φ(K_i);  V'_i = φ(Q_i)ᵀ s_i / φ(Q_i)ᵀ z_i.
    phi_q, phi_k (B, H, T, D), v (B, H, T, Dv) -> (B, H, T, Dv).
    """
    B, H, T, D = phi_k.shape
    if state.S is None or state.z is None:
        state.S = phi_k.new_zeros(B, H, D, v.shape[-1])
        state.z = phi_k.new_zeros(B, H, D)
    outs = []
    for t in range(T):
        state.S = state.S + phi_k[:, :, t, :, None] * v[:, :, t, None, :]  # (B, H, D, Dv)
        state.z = state.z + phi_k[:, :, t]  # (B, H, D)
        num = torch.einsum("bhd,bhde->bhe", phi_q[:, :, t], state.S)  # (B, H, Dv)
        den = (phi_q[:, :, t] * state.z).sum(dim=-1, keepdim=True)  # (B, H, 1)
        outs.append(num / den.clamp_min(torch.finfo(den.dtype).tiny))
    state.length += T
    return torch.stack(outs, dim=2)  # (B, H, T, Dv)
