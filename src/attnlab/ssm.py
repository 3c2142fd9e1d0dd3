"""Mamba: the selective state-space block (Gu & Dao 2023), and a small Mamba language model.

Per channel d of the inner width and state size N, a continuous linear system
h'(t) = A h(t) + B x(t), y(t) = C h(t) (eq. 1) is discretised with a step Δ by zero-order hold
on A and Euler on B (Alg. 2):  Ā = exp(Δ A),  B̄ x = Δ B x,  then scanned over time (eq. 2):

    h_t = Ā_t h_{t-1} + B̄_t x_t,        y_t = C_t h_t + D x_t.

"Selective" means Δ, B and C are computed from the input at every position (Alg. 2, lines 3-5):
B_t, C_t = Linear_N(x_t), Δ_t = softplus(Linear_D(Linear_R(x_t))) with a rank-R bottleneck;
A = −exp(A_log) is a learned (D_inner, N) matrix, the same at every step.

The block (Gu & Dao 2023, fig. 3): in_proj to 2·D_inner (x and the gate z), a causal depthwise
conv1d of width d_conv over x, SiLU, the selective scan, y · SiLU(z), out_proj back to d_model.

Two scans compute the same recurrence: :func:`selective_scan_sequential`, a plain loop over time
(the readable reference) and :func:`selective_scan_chunked`, the fast path (a parallel
Hillis–Steele scan inside chunks, a carry of the state across chunks). Decoding runs the block
one token at a time from a :class:`MambaCache` (the last d_conv − 1 conv inputs and the state
h), so each new token costs the same whatever the length so far.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.blocks import RMSNorm
from attnlab.configs import ConfigBase
from attnlab.errors import UserError

SCANS = ("chunked", "sequential")


# --------------------------------------------------------------------------- the scan


def selective_step(
    x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h: Tensor
) -> tuple[Tensor, Tensor]:
    """One step of eq. 2: h ← exp(Δ A) ⊙ h + Δ B x;  y = C h.

    x, delta (batch, D); A (D, N); B, C (batch, N); h (batch, D, N) -> y (batch, D), new h.
    """
    A_bar = torch.exp(delta[..., None] * A)  # (b, D, N)
    Bx_bar = (delta * x)[..., None] * B[:, None, :]  # (b, D, N)
    h = A_bar * h + Bx_bar  # (b, D, N)
    y = (h * C[:, None, :]).sum(dim=-1)  # (b, D)
    return y, h


def selective_scan_sequential(
    x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The recurrence of eq. 2 as a loop over time (Alg. 2 read literally).

    x, delta (batch, T, D); A (D, N); B, C (batch, T, N); h0 (batch, D, N) or None (zeros)
    -> y (batch, T, D) without the D·x skip, and the last state h_T (batch, D, N).
    """
    _check_scan_shapes(x, delta, A, B, C)
    h = x.new_zeros(x.shape[0], x.shape[2], A.shape[1]) if h0 is None else h0  # (b, D, N)
    ys = []
    for t in range(x.shape[1]):
        y, h = selective_step(x[:, t], delta[:, t], A, B[:, t], C[:, t], h)
        ys.append(y)
    return torch.stack(ys, dim=1), h  # (b, T, D), (b, D, N)


def selective_scan_chunked(
    x: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    h0: Tensor | None = None,
    chunk: int = 16,
) -> tuple[Tensor, Tensor]:
    """The same recurrence as :func:`selective_scan_sequential`, computed in parallel chunks.

    h_t = a_t h_{t-1} + b_t with a_t = exp(Δ_t A), b_t = Δ_t B_t x_t is a scan under the
    associative operator (a, b) ∘ (a', b') = (a a', a' b + b'). Inside each chunk of ``chunk``
    steps a Hillis–Steele scan applies it log2(chunk) times to all positions at once (it only
    multiplies decays a ≤ 1, so nothing overflows, unlike exp(−cumsum) tricks); each chunk
    starts from the previous chunk's last state. Only the chunk boundaries' states are kept:
    the backward pass recomputes each chunk's states and runs the adjoint recurrence
    g_t = C_t ∂y_t + a_{t+1} g_{t+1} (the same scan, reversed), so memory grows with T·D, not
    T·D·N. Same shapes in and out as the sequential scan.
    """
    _check_scan_shapes(x, delta, A, B, C)
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if h0 is None:
        h0 = x.new_zeros(x.shape[0], x.shape[2], A.shape[1])  # (b, D, N)
    return _ChunkedScan.apply(x, delta, A, B, C, h0, chunk)


def _scan_within(a: Tensor, b: Tensor, h: Tensor) -> Tensor:
    """States of h_t = a_t h_{t-1} + b_t over one chunk: a, b (b, L, D, N), h (b, D, N) the
    state before the chunk -> (b, L, D, N). Hillis–Steele: log2(L) steps over all positions."""
    L, shift = a.shape[1], 1
    while shift < L:
        b = b + a * F.pad(b[:, :-shift], (0, 0, 0, 0, shift, 0))  # (b, L, D, N)
        a = a * F.pad(a[:, :-shift], (0, 0, 0, 0, shift, 0), value=1.0)  # (b, L, D, N)
        shift *= 2
    return a * h[:, None] + b  # (b, L, D, N)


def _pad_time(t: Tensor, pad: int) -> Tensor:
    """Zeros after the end along dim 1 (Δ = 0 there: a = 1, b = 0, the state holds)."""
    return F.pad(t, (0, 0, 0, pad)) if pad else t


class _ChunkedScan(torch.autograd.Function):
    """Forward: chunk by chunk, keeping the state at each chunk start. Backward: chunks in
    reverse, recomputing their states, with the adjoint scan and the local derivatives
    ∂a/∂(ΔA) = a, b = Δ x B."""

    @staticmethod
    def forward(ctx, x, delta, A, B, C, h0, chunk):
        T = x.shape[1]
        L = min(chunk, T)
        pad = -T % L
        xs, ds, Bs, Cs = (_pad_time(t, pad) for t in (x, delta, B, C))  # (b, T', ·)
        h = h0
        starts, ys = [], []
        with torch.no_grad():
            for t0 in range(0, T + pad, L):
                d, u = ds[:, t0 : t0 + L], xs[:, t0 : t0 + L]  # (b, L, D)
                a = torch.exp(d[..., None] * A)  # (b, L, D, N)
                bx = (d * u)[..., None] * Bs[:, t0 : t0 + L, None, :]  # (b, L, D, N)
                starts.append(h)
                hs = _scan_within(a, bx, h)  # (b, L, D, N)
                ys.append(torch.einsum("bldn,bln->bld", hs, Cs[:, t0 : t0 + L]))
                h = hs[:, -1]  # (b, D, N)
        ctx.save_for_backward(x, delta, A, B, C, torch.stack(starts))
        ctx.chunk = L
        return torch.cat(ys, dim=1)[:, :T], h  # (b, T, D), (b, D, N)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy, gh):
        x, delta, A, B, C, starts = ctx.saved_tensors
        T, L = x.shape[1], ctx.chunk
        pad = -T % L
        xs, ds, Bs, Cs = (_pad_time(t, pad) for t in (x, delta, B, C))
        gy = _pad_time(gy if gy is not None else torch.zeros_like(x), pad)  # (b, T', D)
        carry = gh if gh is not None else torch.zeros_like(starts[0])  # (b, D, N)
        gx, gd, gB, gC = (torch.zeros_like(t) for t in (xs, ds, Bs, Cs))
        gA = torch.zeros_like(A)
        for c in reversed(range(starts.shape[0])):
            sl = slice(c * L, (c + 1) * L)
            d, u, Bc, Cc = ds[:, sl], xs[:, sl], Bs[:, sl], Cs[:, sl]
            a = torch.exp(d[..., None] * A)  # (b, L, D, N)
            bx = (d * u)[..., None] * Bc[:, :, None, :]  # (b, L, D, N)
            hs = _scan_within(a, bx, starts[c])  # (b, L, D, N) recomputed
            h_prev = torch.cat([starts[c][:, None], hs[:, :-1]], dim=1)  # (b, L, D, N)
            # adjoint: g_t = C_t gy_t + a_{t+1} g_{t+1}, the chunk's end fed by ``carry``
            src = gy[:, sl, :, None] * Cc[:, :, None, :]  # (b, L, D, N)
            src[:, -1] += carry
            coef = F.pad(a[:, 1:], (0, 0, 0, 0, 0, 1))  # (b, L, D, N) a_{t+1}, 0 at the end
            g = _scan_within(coef.flip(1), src.flip(1), torch.zeros_like(carry)).flip(1)
            carry = a[:, 0] * g[:, 0]  # ∂/∂(state before the chunk)
            g_logA = g * h_prev * a  # (b, L, D, N)  ∂/∂(Δ A)
            gA += torch.einsum("bldn,bld->dn", g_logA, d)
            gBx = torch.einsum("bldn,bln->bld", g, Bc)  # (b, L, D)  Σ_n g B
            gd[:, sl] = torch.einsum("bldn,dn->bld", g_logA, A) + gBx * u
            gx[:, sl] = gBx * d
            gB[:, sl] = torch.einsum("bldn,bld->bln", g, d * u)
            gC[:, sl] = torch.einsum("bldn,bld->bln", hs, gy[:, sl])
        return gx[:, :T], gd[:, :T], gA, gB[:, :T], gC[:, :T], carry, None


def _check_scan_shapes(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor) -> None:
    if x.dim() != 3 or delta.shape != x.shape:
        raise UserError(
            f"x and delta must both be (batch, T, D), got {tuple(x.shape)}, {tuple(delta.shape)}"
        )
    want = (x.shape[0], x.shape[1], A.shape[1])
    if A.shape[0] != x.shape[2] or tuple(B.shape) != want or tuple(C.shape) != want:
        raise UserError(
            f"with x {tuple(x.shape)}: A must be (D, N) = ({x.shape[2]}, N), B and C "
            f"(batch, T, N); got A {tuple(A.shape)}, B {tuple(B.shape)}, C {tuple(C.shape)}"
        )


# --------------------------------------------------------------------------- the block


class MambaCache:
    """Decoding state of one Mamba block: ``conv`` (B, D_inner, d_conv − 1), the last conv
    inputs; ``ssm`` (B, D_inner, N), the state h; ``length``, positions seen so far.
    Its size does not grow with the sequence."""

    def __init__(self) -> None:
        self.conv: Tensor | None = None
        self.ssm: Tensor | None = None
        self.length = 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',) (finished rows dropped, beam search)."""
        if self.conv is not None and self.ssm is not None:
            self.conv = self.conv.index_select(0, index)
            self.ssm = self.ssm.index_select(0, index)

    def nbytes(self) -> int:
        """Memory held by the state, in bytes."""
        return sum(t.numel() * t.element_size() for t in (self.conv, self.ssm) if t is not None)


def check_mamba_config(d_model: int, d_state: int, d_conv: int, expand: int, dt_rank: int) -> None:
    """Raise ValueError naming the field to change."""
    for name, value, low in (
        ("d_model", d_model, 1),
        ("d_state", d_state, 1),
        ("d_conv", d_conv, 1),
        ("expand", expand, 1),
        ("dt_rank", dt_rank, 0),
    ):
        if value < low:
            raise UserError(f"{name} must be >= {low}, got {value}")


class MambaBlock(nn.Module):
    """The Mamba mixer (Gu & Dao 2023, fig. 3 and Alg. 2): x (B, T, d_model) -> (B, T, d_model).

    Parameters, with D_inner = expand · d_model and R = dt_rank (0 = ⌈d_model / 16⌉):
    ``in_proj`` d_model -> 2·D_inner (x, gate z); ``conv1d`` depthwise, width d_conv, causal;
    ``x_proj`` D_inner -> R + 2N (Δ's low-rank input, B, C); ``dt_proj`` R -> D_inner with bias;
    ``A_log`` (D_inner, N), A = −exp(A_log); ``D`` (D_inner,) skip; ``out_proj`` D_inner -> d_model.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        d_conv: int = 4,
        expand: int = 2,
        dt_rank: int = 0,
        bias: bool = False,
        conv_bias: bool = True,
        scan: str = "chunked",
        chunk: int = 16,
    ) -> None:
        super().__init__()
        check_mamba_config(d_model, d_state, d_conv, expand, dt_rank)
        if scan not in SCANS:
            raise ValueError(f"scan must be one of {', '.join(SCANS)}, got {scan!r}")
        self.d_inner = expand * d_model
        self.d_state = d_state
        self.d_conv = d_conv
        self.dt_rank = dt_rank or math.ceil(d_model / 16)
        self.scan = scan
        self.chunk = chunk
        Di = self.d_inner
        self.in_proj = nn.Linear(d_model, 2 * Di, bias=bias)
        self.conv1d = nn.Conv1d(Di, Di, d_conv, groups=Di, bias=conv_bias)
        self.x_proj = nn.Linear(Di, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, Di, bias=True)
        self.A_log = nn.Parameter(torch.empty(Di, d_state))
        self.D = nn.Parameter(torch.empty(Di))
        self.out_proj = nn.Linear(Di, d_model, bias=bias)
        self.reset_ssm_parameters()

    @torch.no_grad()
    def reset_ssm_parameters(
        self, dt_min: float = 1e-3, dt_max: float = 0.1, dt_floor: float = 1e-4
    ) -> None:
        """Mamba's initialisation of the SSM parameters (Gu & Dao 2023, §3.6 and appendix):
        A = −(1, 2, ..., N) per channel (S4D-real), D = 1, Δ's bias so that softplus(bias) is
        log-uniform in [dt_min, dt_max], dt_proj's weight uniform in ±R^(−1/2). Call it again
        after any model-wide re-initialisation that touched dt_proj."""
        N = self.d_state
        A = torch.arange(1, N + 1, dtype=torch.float32).expand(self.d_inner, N)  # (Di, N)
        self.A_log.copy_(torch.log(A))
        self.D.fill_(1.0)
        nn.init.uniform_(self.dt_proj.weight, -(self.dt_rank**-0.5), self.dt_rank**-0.5)
        log_dt = torch.rand(self.d_inner) * (math.log(dt_max) - math.log(dt_min))
        dt = torch.exp(log_dt + math.log(dt_min)).clamp(min=dt_floor)  # (Di,)
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)

    def new_cache(self) -> MambaCache:
        return MambaCache()

    def _conv(self, u: Tensor, cache: MambaCache | None) -> Tensor:
        """Causal depthwise conv + SiLU: u (B, T, Di) -> (B, T, Di); the cache holds the
        d_conv − 1 inputs before u (zeros at the start) and is updated with u's last ones."""
        u = u.transpose(1, 2)  # (B, Di, T)
        K = self.d_conv
        if cache is not None and cache.conv is not None:
            past = cache.conv  # (B, Di, K-1)
        else:
            past = u.new_zeros(u.shape[0], u.shape[1], K - 1)  # (B, Di, K-1)
        full = torch.cat([past, u], dim=-1)  # (B, Di, K-1+T)
        if cache is not None:
            cache.conv = full[:, :, full.shape[-1] - (K - 1) :].detach()  # (B, Di, K-1)
        if u.shape[-1] == 1:  # one decoding step: a dot product per channel, no conv kernel
            out = (full * self.conv1d.weight[:, 0]).sum(-1, keepdim=True)  # (B, Di, 1)
            if self.conv1d.bias is not None:
                out = out + self.conv1d.bias[:, None]
        else:
            out = F.conv1d(full, self.conv1d.weight, self.conv1d.bias, groups=self.d_inner)
        return F.silu(out).transpose(1, 2)  # (B, T, Di)

    def forward(self, x: Tensor, cache: MambaCache | None = None) -> Tensor:
        """x (B, T, d_model) -> (B, T, d_model). With ``cache``, x continues the sequence held
        there (one token: the recurrent step; several: the scan from the cached state) and the
        cache is updated."""
        if x.dim() != 3:
            raise ValueError(f"x must be (B, T, d_model), got shape {tuple(x.shape)}")
        T = x.shape[1]
        xz = self.in_proj(x)  # (B, T, 2Di)
        u, z = xz.chunk(2, dim=-1)  # (B, T, Di) each
        u = self._conv(u, cache)  # (B, T, Di)
        dt_low, B, C = self.x_proj(u).split([self.dt_rank, self.d_state, self.d_state], -1)
        delta = F.softplus(self.dt_proj(dt_low))  # (B, T, Di)
        A = -torch.exp(self.A_log)  # (Di, N)
        h0 = cache.ssm if cache is not None else None  # (B, Di, N) or None
        if h0 is not None and T == 1:
            y, h = selective_step(u[:, 0], delta[:, 0], A, B[:, 0], C[:, 0], h0)
            y = y[:, None]  # (B, 1, Di)
        else:
            y, h = self._scan_fn()(u, delta, A, B, C, h0)  # (B, T, Di), (B, Di, N)
        if cache is not None:
            cache.ssm = h.detach()
            cache.length += T
        y = (y + u * self.D) * F.silu(z)  # (B, T, Di)
        return self.out_proj(y)  # (B, T, d_model)

    def _scan_fn(self) -> Callable[..., tuple[Tensor, Tensor]]:
        if self.scan == "sequential":
            return selective_scan_sequential
        return lambda *args: selective_scan_chunked(*args, chunk=self.chunk)


# --------------------------------------------------------------------------- language model


@dataclass
class MambaLMConfig(ConfigBase):
    """A pure Mamba language model, laid out like Hugging Face's MambaForCausalLM."""

    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int = 0
    norm_eps: float = 1e-5
    bias: bool = False
    conv_bias: bool = True
    scan: Literal["chunked", "sequential"] = "chunked"


class MambaResidual(nn.Module):
    """x + Mamba(RMSNorm(x)): one pre-norm residual layer."""

    def __init__(self, cfg: MambaLMConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mixer = MambaBlock(
            cfg.d_model,
            d_state=cfg.d_state,
            d_conv=cfg.d_conv,
            expand=cfg.expand,
            dt_rank=cfg.dt_rank,
            bias=cfg.bias,
            conv_bias=cfg.conv_bias,
            scan=cfg.scan,
        )

    def forward(self, x: Tensor, cache: MambaCache | None = None) -> Tensor:
        return x + self.mixer(self.norm(x), cache)  # (B, T, D)


class MambaLM(nn.Module):
    """ids (B, T) -> logits (B, T, V): embedding, N residual Mamba layers, RMSNorm, tied head."""

    def __init__(self, cfg: MambaLMConfig) -> None:
        super().__init__()
        if cfg.vocab_size < 1 or cfg.n_layers < 1:
            raise ValueError(
                f"vocab_size and n_layers must be >= 1, got {cfg.vocab_size}, {cfg.n_layers}"
            )
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(MambaResidual(cfg) for _ in range(cfg.n_layers))
        self.norm_f = RMSNorm(cfg.d_model, eps=cfg.norm_eps)

    def new_caches(self) -> list[MambaCache]:
        return [layer.mixer.new_cache() for layer in self.layers]

    def forward(self, ids: Tensor, caches: list[MambaCache] | None = None) -> Tensor:
        if ids.dim() != 2:
            raise ValueError(f"ids must be (B, T) token ids, got shape {tuple(ids.shape)}")
        x = self.tok_emb(ids)  # (B, T, D)
        for i, layer in enumerate(self.layers):
            x = layer(x, None if caches is None else caches[i])  # (B, T, D)
        x = self.norm_f(x)  # (B, T, D)
        return F.linear(x, self.tok_emb.weight)  # (B, T, V), head tied to the embedding

    @torch.no_grad()
    def greedy(self, ids: Tensor, steps: int) -> Tensor:
        """Greedy continuation with the state cache: ids (B, T) -> (B, T + steps)."""
        caches = self.new_caches()
        logits = self(ids, caches)[:, -1]  # (B, V)
        out = [ids]
        for i in range(steps):
            nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            out.append(nxt)
            if i + 1 < steps:
                logits = self(nxt, caches)[:, -1]  # (B, V)
        return torch.cat(out, dim=1)  # (B, T + steps)
