"""Positional information: absolute (sinusoidal, learned), rotary, and relative biases (T5, ALiBi).

Absolute encodings are added to the token embeddings: ``forward(x, offset)`` returns
``x + P[offset : offset + T]``. RoPE rotates per-head queries and keys inside attention
(it plugs into :class:`attnlab.layers.attention.MultiHeadAttention` as its ``rotary`` hook). T5 and
ALiBi produce an additive score bias (1, H, Tq, Tk) passed to attention as ``bias=``.
ViT's fixed 2-D sine-cosine grid is absolute too. :func:`make_positions` builds any of them
from a config's ``pos`` choice; every model gets its positional modules from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor, nn

PositionKind = Literal["sinusoidal", "learned", "rope", "t5", "alibi", "sincos2d", "none"]
RopeScaling = Literal["none", "linear", "ntk"]


def sinusoid_table(n_positions: int, d_model: int, base: float = 10000.0) -> Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(...)  (Vaswani 2017, §3.5)."""
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (P, 1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(base) / d_model))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * div)  # (P, ceil(D/2))
    table[:, 1::2] = torch.cos(position * div[: d_model // 2])  # (P, floor(D/2))
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal encoding added to embeddings; a buffer that extends itself on demand."""

    def __init__(self, d_model: int, context: int = 512, base: float = 10000.0) -> None:
        super().__init__()
        self.d_model, self.base = d_model, base
        self.register_buffer("table", sinusoid_table(context, d_model, base), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (B, T, D) -> x + PE[offset : offset + T]."""
        end = offset + x.shape[1]
        if end > self.table.shape[0]:  # a formula, not a table of parameters: just compute more
            self.table = sinusoid_table(2 * end, self.d_model, self.base).to(self.table.device)
        return x + self.table[offset:end].to(x.dtype)  # (B, T, D)


class LearnedPositionalEmbedding(nn.Module):
    """A trained vector per position (BERT, GPT-2, ViT), for ``context`` positions."""

    def __init__(self, context: int, d_model: int) -> None:
        super().__init__()
        self.context = context
        self.embedding = nn.Embedding(context, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (B, T, D) -> x + E[offset : offset + T]."""
        end = offset + x.shape[1]
        if end > self.context:
            raise ValueError(
                f"sequence reaches position {end} but the learned position table has context="
                f"{self.context}; truncate inputs to {self.context} tokens or build the model "
                "with a larger context (or use sinusoidal / rope positions, which have no limit)"
            )
        positions = torch.arange(offset, end, device=x.device)  # (T,)
        return x + self.embedding(positions)  # (B, T, D)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al. 2021, eq. 34): rotate each query/key pair of channels by angle m·θ_i.

    Uses the half-split pairing (channel i with i + Dh/2) of GPT-NeoX and LLaMA, so weights
    from those models load unchanged. Call as ``q, k = rope(q, k, offset)`` on (B, H, T, Dh).

    ``scaling`` stretches a trained model to ``factor`` times its context at inference, with no
    retraining: ``linear`` is position interpolation, angle (m / s)·θ_i (Chen et al. 2023, eq. 4);
    ``ntk`` is NTK-aware scaling, base' = base · s^(Dh/(Dh−2)) (bloc97 2023), which leaves the
    fastest pair (θ_0 = 1) untouched and slows the slowest one by exactly s.
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        context: int = 2048,
        scaling: RopeScaling = "none",
        factor: float = 1.0,
    ) -> None:
        super().__init__()
        if head_dim % 2 != 0:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        if scaling not in get_args(RopeScaling) or factor <= 0:
            raise ValueError(
                f"RoPE scaling must be one of {', '.join(get_args(RopeScaling))} with factor > 0, "
                f"got {scaling!r}, factor={factor}"
            )
        if scaling == "ntk":
            base = base * factor ** (head_dim / (head_dim - 2))
        self.position_scale = 1.0 / factor if scaling == "linear" else 1.0
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (Dh/2,)
        self._build(context)

    def _build(self, n_positions: int) -> None:
        t = torch.arange(n_positions, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(t * self.position_scale, self.inv_freq)  # (P, Dh/2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (P, Dh)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, q: Tensor, k: Tensor, offset: int = 0) -> tuple[Tensor, Tensor]:
        """Rotate q (B, H, Tq, Dh) and k (B, Hkv, Tk, Dh); the new positions start at offset."""
        t_q, t_k = q.shape[2], k.shape[2]
        end = offset + max(t_q, t_k)
        if end > self.cos.shape[0]:
            self._build(2 * end)
        cos_k = self.cos[offset : offset + t_k].to(k.dtype)  # (Tk, Dh)
        sin_k = self.sin[offset : offset + t_k].to(k.dtype)
        cos_q = self.cos[offset + t_k - t_q : offset + t_k].to(q.dtype)  # (Tq, Dh), last Tq
        sin_q = self.sin[offset + t_k - t_q : offset + t_k].to(q.dtype)
        q = q * cos_q + rotate_half(q) * sin_q
        k = k * cos_k + rotate_half(k) * sin_k
        return q, k


def t5_relative_bucket(
    relative_position: Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """Map key−query offsets to buckets: exact for small offsets, log-spaced up to max_distance.

    Raffel et al. 2020 (T5), §2.1. Half of the buckets hold exact offsets 0..n/2-1, the rest
    grow logarithmically; offsets beyond ``max_distance`` share the last bucket. When
    bidirectional, keys after the query use a separate half of the buckets.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)  # only keys at or before the query
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(
        max_distance / max_exact
    )
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class T5RelativePositionBias(nn.Module):
    """Learned scalar per (bucket, head) added to attention scores (T5)."""

    def __init__(
        self,
        n_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
    ) -> None:
        super().__init__()
        exact = num_buckets // (4 if bidirectional else 2)  # distances with a bucket of their own
        if max_distance <= exact:
            raise ValueError(
                f"T5 relative positions: max_distance={max_distance} must exceed the exact "
                f"range ({exact} for {num_buckets} buckets, "
                f"{'bi' if bidirectional else 'uni'}directional); raise max_distance or use "
                "fewer buckets"
            )
        self.n_heads, self.num_buckets = n_heads, num_buckets
        self.max_distance, self.bidirectional = max_distance, bidirectional
        self.embedding = nn.Embedding(num_buckets, n_heads)

    def forward(self, t_q: int, t_k: int, offset: int | None = None) -> Tensor:
        """Bias (1, H, Tq, Tk); query i sits at position ``offset + i`` (default Tk − Tq)."""
        offset = t_k - t_q if offset is None else offset
        device = self.embedding.weight.device
        query_pos = torch.arange(offset, offset + t_q, device=device)[:, None]  # (Tq, 1)
        key_pos = torch.arange(t_k, device=device)[None, :]  # (1, Tk)
        buckets = t5_relative_bucket(
            key_pos - query_pos, self.bidirectional, self.num_buckets, self.max_distance
        )  # (Tq, Tk)
        return self.embedding(buckets).permute(2, 0, 1)[None]  # (1, H, Tq, Tk)


def alibi_slopes(n_heads: int) -> Tensor:
    """Head slopes 2^(-8/n), 2^(-16/n), ... (Press et al. 2022, §3); interleaved if n is not 2^k."""

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two_slopes(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two_slopes(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_two_slopes(closest) + extra)


class ALiBi(nn.Module):
    """Attention with Linear Biases: score bias −m_h · |i − j| (causal: keys j ≤ i only matter)."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)  # (H,)

    def forward(self, t_q: int, t_k: int, offset: int | None = None) -> Tensor:
        """Bias (1, H, Tq, Tk); query i sits at position ``offset + i`` (default Tk − Tq)."""
        offset = t_k - t_q if offset is None else offset
        device = self.slopes.device
        query_pos = torch.arange(offset, offset + t_q, device=device)[:, None]  # (Tq, 1)
        key_pos = torch.arange(t_k, device=device)[None, :]  # (1, Tk)
        distance = (query_pos - key_pos).abs().float()  # (Tq, Tk)
        return -self.slopes[None, :, None, None] * distance[None, None]  # (1, H, Tq, Tk)


def sincos_2d_table(grid: int, d_model: int) -> Tensor:
    """Fixed 2-D positions: concat(PE_1d(row), PE_1d(col)), each half D/2 wide  (MAE, ViT-S/16)."""
    table = sinusoid_table(grid, d_model // 2)  # (G, D/2)
    rows = table[:, None, :].expand(grid, grid, -1)  # (G, G, D/2): row index
    cols = table[None, :, :].expand(grid, grid, -1)  # (G, G, D/2): column index
    return torch.cat([rows, cols], dim=-1).reshape(grid * grid, d_model)  # (G², D)


class SinCos2DPositionalEncoding(nn.Module):
    """Fixed 2-D encoding of a ``grid`` x ``grid`` patch sequence (row-major) added to x; the
    ``n_prefix`` leading tokens (a class token) get none."""

    def __init__(self, grid: int, d_model: int, n_prefix: int = 0) -> None:
        super().__init__()
        table = torch.cat([torch.zeros(n_prefix, d_model), sincos_2d_table(grid, d_model)])
        self.register_buffer("table", table, persistent=False)  # (n_prefix + G², D)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (B, T, D) -> x + P[offset : offset + T]."""
        return x + self.table[offset : offset + x.shape[1]].to(x.dtype)  # (B, T, D)


@dataclass
class Positions:
    """The positional modules of one model; any of them may be None.

    ``absolute(x, offset)`` adds a position vector to each embedding, ``rotary`` is the RoPE
    hook every attention layer gets, ``bias(t_q, t_k, offset)`` the (1, H, Tq, Tk) score bias.
    """

    absolute: nn.Module | None = None
    rotary: RotaryEmbedding | None = None
    bias: nn.Module | None = None


def make_positions(
    kind: PositionKind,
    d_model: int,
    n_heads: int,
    context: int,
    *,
    rope_base: float = 10000.0,
    rope_scaling: RopeScaling = "none",
    rope_factor: float = 1.0,
    causal: bool = False,
    grid: int = 0,
    n_prefix: int = 0,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Positions:
    """The positional modules for a config's ``pos``: the one factory every model uses.

    ``context`` sizes the learned table (and the first sinusoid/RoPE table, which grow on
    demand); ``causal`` makes T5 buckets one-sided; ``sincos2d`` needs the patch ``grid`` and
    the number of ``n_prefix`` tokens before the patches; ``rope_scaling``/``rope_factor``
    stretch RoPE to longer inputs (see :class:`RotaryEmbedding`); ``num_buckets``/``max_distance``
    size the T5 bias's buckets.
    """
    if kind == "sinusoidal":
        return Positions(absolute=SinusoidalPositionalEncoding(d_model, context))
    if kind == "learned":
        return Positions(absolute=LearnedPositionalEmbedding(context, d_model))
    if kind == "sincos2d":
        if grid < 1 or d_model % 4:
            raise ValueError(
                f"pos='sincos2d' needs a patch grid >= 1 and d_model divisible by 4, got grid="
                f"{grid}, d_model={d_model}"
            )
        return Positions(absolute=SinCos2DPositionalEncoding(grid, d_model, n_prefix))
    if kind == "rope":
        rotary = RotaryEmbedding(d_model // n_heads, rope_base, context, rope_scaling, rope_factor)
        return Positions(rotary=rotary)
    if kind == "t5":
        bias = T5RelativePositionBias(n_heads, num_buckets, max_distance, bidirectional=not causal)
        return Positions(bias=bias)
    if kind == "alibi":
        return Positions(bias=ALiBi(n_heads))
    if kind == "none":
        return Positions()
    raise ValueError(f"pos must be one of {', '.join(get_args(PositionKind))}, got {kind!r}")
