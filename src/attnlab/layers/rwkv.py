"""RWKV-4 (Peng et al. 2023, "RWKV: Reinventing RNNs for the Transformer Era"): time-mix and
channel-mix, a sequence mixer and a feed-forward for the GPT (``mixer = "rwkv"``).

What it changes relative to the core block (:class:`attnlab.layers.blocks.Block`): attention is
replaced by the **time-mix**, a linear-time weighted average over the past with a learned
per-channel decay, and the MLP by the **channel-mix**; both first mix each input with the
previous position's ("token shift"). The residual wiring and the norms are the block's; the first
layer also normalises the embeddings (RWKV's ``ln0``, Hugging Face's ``pre_ln``).

Time-mix (eq. 14-16 of the paper; w = exp(time_decay) > 0, u = time_first):

    r_t, k_t, v_t = W_r (μ_r x_t + (1−μ_r) x_{t−1}), W_k (…), W_v (…)
    wkv_t = (Σ_{i<t} e^{−(t−1−i) w + k_i} v_i + e^{u + k_t} v_t)
          / (Σ_{i<t} e^{−(t−1−i) w + k_i}     + e^{u + k_t})
    out_t = W_o (σ(r_t) ⊙ wkv_t)

Two forms compute wkv: :func:`wkv_sequential`, the recurrence over a state (numerator,
denominator, running maximum of the exponents, so nothing overflows) that also decodes one
token at a time, and :func:`wkv_chunked`, the parallel form: inside chunks of ``chunk``
positions the past is one matrix product per channel with the decays e^{−(j−1−l) w} (every
weight formed and stabilised per output position when a chunk's keys span too wide a range),
and the states entering the chunks are formed at once from the chunks' own sums.

Channel-mix (eq. 17-18): out_t = σ(W_r x'_t) ⊙ W_v relu(W_k x''_t)², x', x'' token-shifted.
Parameter names and shapes are Hugging Face's ``RwkvSelfAttention`` / ``RwkvFeedForward``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.attention_record import channel_groups, is_recording, record_mixer_weights

NEG = -1e30  # the running maximum of an empty state (as Hugging Face's); exp(NEG - m) = 0


class RwkvCache:
    """Decoding state of one RWKV layer: the last inputs of the time-mix and channel-mix
    (token shift, (B, D) each) and the wkv state (numerator, denominator, max exponent; (B, D)
    each). Its size does not grow with the sequence."""

    def __init__(self) -> None:
        self.att_shift: Tensor | None = None
        self.ffn_shift: Tensor | None = None
        self.wkv: tuple[Tensor, Tensor, Tensor] | None = None
        self.length = 0

    def tensors(self) -> list[Tensor]:
        held = [self.att_shift, self.ffn_shift, *(self.wkv or ())]
        return [t for t in held if t is not None]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',)."""
        if self.att_shift is not None:
            self.att_shift = self.att_shift.index_select(0, index)
        if self.ffn_shift is not None:
            self.ffn_shift = self.ffn_shift.index_select(0, index)
        if self.wkv is not None:
            self.wkv = tuple(t.index_select(0, index) for t in self.wkv)  # type: ignore[assignment]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


# --------------------------------------------------------------------------- wkv, two forms


def _merge(num1: Tensor, den1: Tensor, m1: Tensor, num2: Tensor, den2: Tensor, m2: Tensor):
    """(num, den) · e^m of two sums added, kept stable: the larger exponent becomes m."""
    m = torch.maximum(m1, m2)
    e1, e2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return e1 * num1 + e2 * num2, e1 * den1 + e2 * den2, m


def wkv_sequential(
    w: Tensor, u: Tensor, k: Tensor, v: Tensor, state: tuple[Tensor, Tensor, Tensor] | None = None
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """wkv by its recurrence (the paper's RNN form, written as Hugging Face's CPU path).

    w (D,) decay rate > 0; u (D,) bonus of the current token; k, v (B, T, D); state (num, den,
    m) with the true sums num · e^m, den · e^m over the past, (B, D) each, or None (empty).
    -> wkv (B, T, D) and the state after the last position.
    """
    if state is None:
        zeros = k.new_zeros(k.shape[0], k.shape[2])  # (B, D)
        state = (zeros, zeros, torch.full_like(zeros, NEG))
    num, den, m = state
    out = []
    for t in range(k.shape[1]):
        kt, vt = k[:, t], v[:, t]  # (B, D)
        a, b, _ = _merge(num, den, m, vt, torch.ones_like(vt), u + kt)  # the output at t
        out.append(a / b)
        num, den, m = _merge(num, den, m - w, vt, torch.ones_like(vt), kt)  # decay, add t
    return torch.stack(out, dim=1), (num, den, m)  # (B, T, D)


def wkv_weights(w: Tensor, u: Tensor, k: Tensor) -> Tensor:
    """The attention that wkv is (no state before the first position): α (B, D, T, T) with
    wkv_t = Σ_{i<=t} α[:, :, t, i] v_i, per channel a softmax over i of the exponents of eq. 14,
    −(t−1−i)·w + k_i for i < t and u + k_t for i = t. w, u (D,); k (B, T, D)."""
    T = k.shape[1]
    pos = torch.arange(T, device=k.device)
    gap = (pos[:, None] - 1 - pos[None, :]).to(k.dtype)  # (T, T): t-1-i
    kk = k.transpose(1, 2)[:, :, None, :]  # (B, D, 1, T): k_i
    past = -gap * w[:, None, None] + kk  # (B, D, T, T)
    now = (u[:, None] + k.transpose(1, 2))[..., None]  # (B, D, T, 1): u + k_t
    diagonal = pos[:, None] == pos[None, :]  # (T, T)
    score = torch.where(diagonal, now, past).masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    return torch.softmax(score, dim=-1)  # (B, D, T, T)


def _chunk_starts(
    state: tuple[Tensor, Tensor, Tensor], num_c: Tensor, den_c: Tensor, m_end: Tensor, Lw: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The state entering each of n chunks and after the last, all at once: the carried state
    is itself a decayed sum (eq. 14 one level up, each chunk a token with decay L·w per chunk).
    Entering chunk c: Σ_{s<=c} e^{m_s − (c−s) L w} (num_s, den_s), source 0 the state before the
    sequence and source s = c'+1 chunk c''s own sums at its end (num_c, den_c, m_end; (B, n, D)
    each); state (B, D) each. Stabilised by each target's largest exponent, as in the chunks.
    -> (num, den, m), (B, n + 1, D) each."""
    num0, den0, m0 = state
    src_num = torch.cat([num0[:, None], num_c], dim=1)  # (B, n + 1, D)
    src_den = torch.cat([den0[:, None], den_c], dim=1)
    src_m = torch.cat([m0[:, None], m_end], dim=1)
    c = torch.arange(src_m.shape[1], device=src_m.device)
    gap = (c[:, None] - c[None, :]).to(src_m.dtype)  # (n + 1, n + 1): c − s
    exps = src_m[:, None] - gap[..., None] * Lw  # (B, n + 1 targets, n + 1 sources, D)
    exps = exps.masked_fill((gap < 0)[..., None], float("-inf"))
    top = exps.amax(dim=2).detach()  # (B, n + 1, D)
    e = torch.exp(exps - top[:, :, None])  # (B, n + 1, n + 1, D)
    return (e * src_num[:, None]).sum(2), (e * src_den[:, None]).sum(2), top


def wkv_chunked(
    w: Tensor,
    u: Tensor,
    k: Tensor,
    v: Tensor,
    state: tuple[Tensor, Tensor, Tensor] | None = None,
    chunk: int = 0,
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """wkv in parallel inside chunks of ``chunk`` positions: same arguments and results as
    :func:`wkv_sequential`. ``chunk = 0`` picks ⌈√T⌉ (at least 4).

    In a chunk (positions j, l = 0..L−1) the exponent of token l at output j is
    k_l − (j−1−l) w for l < j, u + k_j for l = j; the state carried in from before the chunk
    enters with m − j w. Each chunk's own sums at its end are formed at once, and from them the
    states entering all chunks (:func:`_chunk_starts`). The outputs are then per channel a
    matrix product with the decays e^{−(j−1−l) w} (:func:`_outputs_by_matmul`) when no exponent
    of a chunk lies more than :func:`matmul_range` below the chunk's largest, and otherwise
    :func:`_outputs_exact`, every weight formed and shifted by its own output's maximum.
    """
    if chunk < 0:
        raise ValueError(f"chunk must be >= 1 (0 = automatic), got {chunk}")
    B, T, D = k.shape
    L = min(chunk or max(4, math.ceil(math.sqrt(T))), T)
    pad = -T % L
    n = (T + pad) // L
    kc = F.pad(k, (0, 0, 0, pad), value=NEG).view(B, n, L, D)  # padding: weight e^NEG = 0
    vc = F.pad(v, (0, 0, 0, pad)).view(B, n, L, D)
    j = torch.arange(L, device=k.device, dtype=k.dtype)
    # each chunk's own sums at its end (exponent k_l − (L−1−l) w), for the carried state
    end = kc - (L - 1 - j)[:, None] * w  # (B, n, L, D)
    m_end = end.amax(dim=2).detach()  # (B, n, D)
    e_end = torch.exp(end - m_end[:, :, None])  # (B, n, L, D)
    num_c, den_c = (e_end * vc).sum(2), e_end.sum(2)  # (B, n, D)
    if state is None:
        zeros = k.new_zeros(B, D)
        state = (zeros, zeros, torch.full_like(zeros, NEG))
    s_num, s_den, s_m = _chunk_starts(state, num_c, den_c, m_end, L * w)  # (B, n + 1, D) each
    starts = s_num[:, :n], s_den[:, :n], s_m[:, :n]  # the state entering each chunk
    # the largest exponent of each chunk's own terms: max_l k_l + max(u, 0) (B, n, 1, D)
    top = kc.amax(dim=2, keepdim=True).detach() + u.detach().clamp(min=0)
    low = torch.where(kc > NEG / 2, u + kc - top, 0.0).amin()  # the smallest diagonal's
    if low > -matmul_range(k.dtype):
        out = _outputs_by_matmul(w, u, kc, vc, top, starts)
    else:
        out = _outputs_exact(w, u, kc, vc, starts)
    out = out.reshape(B, n * L, D)[:, :T]  # (B, T, D)
    return out, (s_num[:, n], s_den[:, n], s_m[:, n] + pad * w)  # padding only decayed it


def matmul_range(dtype: torch.dtype) -> float:
    """How far below a chunk's largest exponent its diagonal terms may lie for the matrix
    form: 0.7 ln(1 / smallest normal), 61 in float32, 496 in float64. Every output then keeps a
    term of at least e^−range next to the shared shift, and what underflows there (below the
    smallest normal, e^−87 in float32) is e^−26 of it or less in float32, e^−212 in float64."""
    return -0.7 * math.log(torch.finfo(dtype).tiny)


def _outputs_by_matmul(
    w: Tensor,
    u: Tensor,
    kc: Tensor,
    vc: Tensor,
    top: Tensor,
    starts: tuple[Tensor, Tensor, Tensor],
) -> Tensor:
    """wkv outputs (B, n, L, D) with the past inside the chunk as one batched matmul per
    channel: Σ_{l<j} e^{−(j−1−l) w} (e^{k_l − top} v_l, e^{k_l − top}), the decays a (D, L, L)
    lower-triangular matrix, every chunk's keys shifted by its own ``top`` (B, n, 1, D) so
    that no factor exceeds 1. kc, vc (B, n, L, D); starts (num, den, m) (B, n, D) each.
    Computed channel first, (D, L, B, n), so that the matmul's operands and gradients are
    contiguous (a strided one makes the CPU kernel copy each of the D matrices)."""
    B, n, L, D = kc.shape
    j = torch.arange(L, device=kc.device, dtype=kc.dtype)
    lag = j[:, None] - 1 - j[None, :]  # (L, L) j−1−l
    decays = torch.exp(-lag.clamp(min=0) * w[:, None, None]) * (lag >= 0)  # (D, L, L)
    k, v = (t.permute(3, 2, 0, 1).contiguous() for t in (kc, vc))  # (D, L, B, n)
    top = top.permute(3, 2, 0, 1).contiguous()  # (D, 1, B, n)
    ek = torch.exp(k - top)  # (D, L, B, n)
    rhs = torch.stack([ek * v, ek], dim=2).view(D, L, 2 * B * n)  # (D, L, 2·B·n)
    past = torch.bmm(decays, rhs).view(D, L, 2, B, n)  # Σ_{l<j} over each chunk's past
    now = torch.exp(u[:, None, None, None] + k - top)  # (D, L, B, n) e^{u + k_j − top}
    s_num, s_den, s_m = (t.permute(2, 0, 1)[:, None].contiguous() for t in starts)  # (D, 1, B, n)
    carried = s_m - j[:, None, None] * w[:, None, None, None]  # (D, L, B, n) start state at j
    shift = torch.maximum(top, carried).detach()  # (D, L, B, n)
    e_own, e_s = torch.exp(top - shift), torch.exp(carried - shift)  # (D, L, B, n)
    numer = e_own * (past[:, :, 0] + now * v) + e_s * s_num  # (D, L, B, n)
    denom = e_own * (past[:, :, 1] + now) + e_s * s_den
    return (numer / denom).permute(2, 3, 1, 0)  # (B, n, L, D)


def _outputs_exact(
    w: Tensor, u: Tensor, kc: Tensor, vc: Tensor, starts: tuple[Tensor, Tensor, Tensor]
) -> Tensor:
    """wkv outputs (B, n, L, D) with every weight e^{score} of output j for token l formed in
    a (B, n, L, L, D) tensor and shifted by that output's largest exponent (robust to any
    range of keys). kc, vc (B, n, L, D); starts (num, den, m) (B, n, D) each."""
    L = kc.shape[2]
    j = torch.arange(L, device=kc.device, dtype=kc.dtype)
    lag = j[:, None] - 1 - j[None, :]  # (L, L) j−1−l
    # what output j adds to key l's exponent: −(j−1−l) w for l < j, u for l = j, −inf after
    add = torch.where(lag[..., None] == -1, u, -lag[..., None] * w)  # (L, L, D)
    add = add.masked_fill((lag < -1)[..., None], float("-inf"))
    score = kc[:, :, None, :, :] + add  # (B, n, L_j, L_l, D) exponents
    s_num, s_den, s_m = starts
    carried = s_m[:, :, None, :] - j[:, None] * w  # (B, n, L, D) the start state at output j
    top = torch.maximum(score.amax(dim=3), carried).detach()  # (B, n, L, D)
    e = torch.exp(score - top[:, :, :, None, :])  # (B, n, L, L, D)
    e_s = torch.exp(carried - top)  # (B, n, L, D)
    numer = (e * vc[:, :, None]).sum(3) + e_s * s_num[:, :, None]  # (B, n, L, D)
    denom = e.sum(3) + e_s * s_den[:, :, None]  # (B, n, L, D)
    return numer / denom


# --------------------------------------------------------------------------- the layers


def _shift(x: Tensor, last: Tensor | None) -> Tensor:
    """Token shift: x (B, T, D) -> the previous position's input (B, T, D); ``last`` (B, D)
    the input before x (zeros at the start)."""
    prev = x.new_zeros(x.shape[0], 1, x.shape[2]) if last is None else last[:, None].to(x)
    return torch.cat([prev, x[:, :-1]], dim=1)  # (B, T, D)


def _lerp(x: Tensor, shifted: Tensor, mu: Tensor) -> Tensor:
    """μ x + (1 − μ) x_{t−1} = x_{t−1} + μ (x − x_{t−1}), per channel, in one kernel."""
    return torch.lerp(shifted, x, mu)


def _ratios(layer: int, n_layers: int) -> tuple[float, float]:
    """RWKV-4's depth ratios: 0 → 1 over the layers, and 1 → ~0."""
    return layer / max(n_layers - 1, 1), 1.0 - layer / n_layers


class TimeMix(nn.Module):
    """RWKV's time-mix: x (B, T, d_model) -> (B, T, d_model), the sequence mixer."""

    is_attention = True  # `record_attention` names its weights (``wkv_weights``)

    def __init__(
        self, d_model: int, layer: int = 0, n_layers: int = 1, d_att: int = 0, chunk: int = 0
    ) -> None:
        super().__init__()
        d_att = d_att or d_model
        self.layer, self.n_layers, self.chunk = layer, n_layers, chunk
        self.form = "chunked"  # or "sequential" (the reference; one-token steps always use it)
        self.view_heads = 4  # channel groups shown as heads by `attnlab explore`
        self.time_decay = nn.Parameter(torch.empty(d_att))
        self.time_first = nn.Parameter(torch.empty(d_att))
        self.time_mix_key = nn.Parameter(torch.empty(1, 1, d_model))
        self.time_mix_value = nn.Parameter(torch.empty(1, 1, d_model))
        self.time_mix_receptance = nn.Parameter(torch.empty(1, 1, d_model))
        self.key = nn.Linear(d_model, d_att, bias=False)
        self.value = nn.Linear(d_model, d_att, bias=False)
        self.receptance = nn.Linear(d_model, d_att, bias=False)
        self.output = nn.Linear(d_att, d_model, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, out_std: float | None = None) -> None:
        """Projections N(0, std), ``output`` N(0, out_std or std); decays, bonus and token-shift
        mixes as RWKV-4 initialises them (by depth: lower layers mix more of the past)."""
        for lin in (self.key, self.value, self.receptance):
            nn.init.normal_(lin.weight, std=std)
        nn.init.normal_(self.output.weight, std=std if out_std is None else out_std)
        r01, r10 = _ratios(self.layer, self.n_layers)
        d_model, d_att = self.key.in_features, self.key.out_features
        x = torch.arange(d_model, dtype=torch.float32) / d_model  # (d_model,)
        h = torch.arange(d_att, dtype=torch.float32) / max(d_att - 1, 1)
        self.time_decay.copy_(-5 + 8 * h ** (0.7 + 1.3 * r01))
        zigzag = 0.5 * (((torch.arange(d_att) + 1) % 3) - 1).float()
        self.time_first.copy_(math.log(0.3) + zigzag)
        self.time_mix_key.copy_(x.pow(r10).view(1, 1, -1))
        self.time_mix_value.copy_((x.pow(r10) + 0.3 * r01).view(1, 1, -1))
        self.time_mix_receptance.copy_(x.pow(0.5 * r10).view(1, 1, -1))

    def forward(self, x: Tensor, cache: RwkvCache | None = None) -> Tensor:
        shifted = _shift(x, cache.att_shift if cache is not None else None)  # (B, T, D)
        k = self.key(_lerp(x, shifted, self.time_mix_key))  # (B, T, Da)
        v = self.value(_lerp(x, shifted, self.time_mix_value))  # (B, T, Da)
        r = torch.sigmoid(self.receptance(_lerp(x, shifted, self.time_mix_receptance)))
        state = cache.wkv if cache is not None else None
        # wkv in float32 at least, outside autocast: exponent differences need the digits
        dtype = torch.promote_types(k.dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):
            w, u = torch.exp(self.time_decay.to(dtype)), self.time_first.to(dtype)
            k, v = k.to(dtype), v.to(dtype)
            if self.form == "sequential" or x.shape[1] == 1:
                y, state = wkv_sequential(w, u, k, v, state)
            else:
                y, state = wkv_chunked(w, u, k, v, state, self.chunk)  # (B, T, Da)
            if is_recording() and cache is None:
                record_mixer_weights(channel_groups(wkv_weights(w, u, k), self.view_heads))
        if cache is not None:
            cache.att_shift = x[:, -1].detach()
            cache.wkv = tuple(t.detach() for t in state)  # type: ignore[assignment]
        return self.output(r * y)  # (B, T, D)


class ChannelMix(nn.Module):
    """RWKV's channel-mix: x (B, T, d_model) -> (B, T, d_model), the feed-forward."""

    def __init__(self, d_model: int, d_ff: int, layer: int = 0, n_layers: int = 1) -> None:
        super().__init__()
        self.layer, self.n_layers = layer, n_layers
        self.time_mix_key = nn.Parameter(torch.empty(1, 1, d_model))
        self.time_mix_receptance = nn.Parameter(torch.empty(1, 1, d_model))
        self.key = nn.Linear(d_model, d_ff, bias=False)
        self.receptance = nn.Linear(d_model, d_model, bias=False)
        self.value = nn.Linear(d_ff, d_model, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, out_std: float | None = None) -> None:
        """key, receptance N(0, std), ``value`` (the output) N(0, out_std or std); token-shift
        mixes as RWKV-4 initialises them."""
        nn.init.normal_(self.key.weight, std=std)
        nn.init.normal_(self.receptance.weight, std=std)
        nn.init.normal_(self.value.weight, std=std if out_std is None else out_std)
        _, r10 = _ratios(self.layer, self.n_layers)
        d_model = self.key.in_features
        x = torch.arange(d_model, dtype=torch.float32) / d_model
        self.time_mix_key.copy_(x.pow(r10).view(1, 1, -1))
        self.time_mix_receptance.copy_(x.pow(r10).view(1, 1, -1))

    def forward(self, x: Tensor, cache: RwkvCache | None = None) -> Tensor:
        shifted = _shift(x, cache.ffn_shift if cache is not None else None)  # (B, T, D)
        if cache is not None:
            cache.ffn_shift = x[:, -1].detach()
        k = torch.square(torch.relu(self.key(_lerp(x, shifted, self.time_mix_key))))  # (B,T,F)
        r = torch.sigmoid(self.receptance(_lerp(x, shifted, self.time_mix_receptance)))
        return r * self.value(k)  # (B, T, D)


class RwkvBlock(nn.Module):
    """One RWKV layer: x + TimeMix(norm1(x)), then x + FFN(norm2(x)); the first layer
    normalises its input first (``pre_norm``, RWKV's ln0). ``ff`` is RWKV's ChannelMix, another
    feed-forward (e.g. a mixture of experts, called ``ff(h)``), or None (no FFN sublayer).
    Called like :class:`attnlab.layers.blocks.Block` (mask, bias and values are for attention
    and ignored; it returns no attention weights)."""

    def __init__(
        self,
        mixer: TimeMix,
        ff: nn.Module | None,
        make_norm: Any,
        pre_norm: bool = False,
    ) -> None:
        super().__init__()
        self.pre_norm = make_norm() if pre_norm else None
        self.norm1 = make_norm()
        self.mixer = mixer
        self.norm2 = make_norm() if ff is not None else None
        self.ff = ff

    def new_cache(self) -> RwkvCache:
        return RwkvCache()

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        is_causal: bool = True,
        bias: Tensor | None = None,
        need_weights: bool = False,
        cache: RwkvCache | None = None,
        values: Tensor | None = None,
    ) -> tuple[Tensor, None]:
        if self.pre_norm is not None:
            x = self.pre_norm(x)
        x = x + self.mixer(self.norm1(x), cache)  # (B, T, D)
        if self.ff is not None:
            h = self.norm2(x)
            x = x + (self.ff(h, cache) if isinstance(self.ff, ChannelMix) else self.ff(h))
        if cache is not None:
            cache.length += x.shape[1]
        return x, None
