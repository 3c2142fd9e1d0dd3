"""Mamba: the selective state-space block (Gu & Dao 2023), a sequence mixer for the GPT.

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
(the readable reference) and :func:`selective_scan_chunked`, the fast path (time cut into
chunks that all advance together, one fused multiply-add per step for every chunk at once, the
states entering the chunks joined by a short loop over chunks, a hand-written backward that
recomputes the states). On the CPU the block's chunked scan runs as one fused C++ kernel
instead, the same function (:mod:`attnlab.layers.ssm_cpp`; ``ATTNLAB_EAGER_SCAN=1`` keeps the eager
scan). Decoding runs the
block one token at a time from a :class:`MambaCache` (the last d_conv − 1 conv inputs and the
state h), so each new token costs the same whatever the length so far. A Mamba language model
is the GPT with ``mixer = "mamba"`` (:mod:`attnlab.models.gpt`; ``ffn = "none"`` gives Gu &
Dao's layout, the mixer alone in each layer).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.attention_record import channel_groups, is_recording, record_mixer_weights
from attnlab.layers.ssm_cpp import selective_scan_compiled, usable

SCANS = ("chunked", "sequential")
LOG2E = math.log2(math.e)  # exp(x) = 2^(x log₂e)
BLOCK = 2**19  # state elements a chunked scan works on at once: 2 MiB per tensor in float32


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


def hidden_attention(delta: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """The attention a selective scan computes implicitly (Ali et al. 2024, "The Hidden
    Attention of Mamba Models", eq. 12): α (batch, D, T, T) with y_t = Σ_{s<=t} α[:, :, t, s]
    x_s from a zero state, α[t, s] = Σ_n C_t[n] exp(Σ_{k=s+1..t} Δ_k A[:, n]) Δ_s B_s[n].
    delta (batch, T, D); A (D, N); B, C (batch, T, N). Entries may be negative."""
    b, T, D = delta.shape
    cum = torch.cumsum(delta[..., None] * A, dim=1)  # (b, T, D, N): Σ_{k<=t} Δ_k A
    rows = []
    for t in range(T):
        decay = torch.exp(cum[:, t : t + 1, :, :] - cum[:, : t + 1])  # (b, t+1, D, N), s <= t
        inp = delta[:, : t + 1, :, None] * B[:, : t + 1, None, :]  # (b, t+1, D, N): Δ_s B_s
        row = (decay * inp * C[:, t, None, None, :]).sum(dim=-1)  # (b, t+1, D)
        rows.append(F.pad(row.transpose(1, 2), (0, T - t - 1)))  # (b, D, T)
    return torch.stack(rows, dim=2)  # (b, D, T, T)


def selective_scan_chunked(
    x: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    h0: Tensor | None = None,
    chunk: int = 0,
    block: int = BLOCK,
) -> tuple[Tensor, Tensor]:
    """The same recurrence as :func:`selective_scan_sequential`, all chunks of time at once.

    The work is cut into blocks of about ``block`` state elements (batch rows × time steps
    × D × N; a stretch of time continues from the state the one before left), so that a
    block's tensors stay in the processor's cache. Inside a block of T steps, time is cut
    into n chunks of L = ``chunk`` steps (0: ⌈√T⌉, which balances the two loops below).
    Position t = c·L + j is stored at [j, c], so step j of every chunk is one contiguous
    block and the recurrence h_t = a_t h_{t−1} + b_t (eq. 2, a_t = exp(Δ_t A),
    b_t = Δ_t x_t B_t) runs for all n chunks together in L fused multiply-adds. Three passes:

    1. each chunk from a zero state, keeping only its last state;
    2. the states entering the chunks, one step per chunk:
       H_{c+1} = exp(A Σ_{j ∈ c} Δ_j) H_c + (chunk c's last state from zero), the decay of a
       whole chunk being exp(A ΣΔ) since A is the same at every step (never > 1: no overflow);
    3. every chunk again from its true starting state H_c, writing all states; y_t = C_t h_t
       is then one batched matmul.

    Only the starting states are kept: the backward pass recomputes the states with pass 3 and
    runs the adjoint recurrence g_t = C_t ∂y_t + a_{t+1} g_{t+1} the same way, reversed, so
    memory grows with T·D, not T·D·N. exp is evaluated as exp2 of Δ·(A log₂e) (the same value,
    a faster kernel). Same shapes in and out as the sequential scan.
    """
    _check_scan_shapes(x, delta, A, B, C)
    if chunk < 0:
        raise ValueError(f"chunk must be >= 1 (0 = automatic), got {chunk}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if h0 is None:
        h0 = x.new_zeros(x.shape[0], x.shape[2], A.shape[1])  # (b, D, N)
    return _ChunkedScan.apply(x, delta, A, B, C, h0, chunk, block)


Blocks = list[tuple[slice, list[tuple[slice, int]]]]


def _blocks(b: int, T: int, DN: int, block: int, chunk: int) -> Blocks:
    """The blocks of a (b, T) scan with D·N = ``DN``, about ``block`` state elements each:
    groups of batch rows, each with its stretches of time in order and their chunk length
    (``chunk``, or ⌈√stretch⌉ for 0)."""
    steps = max(1, block // DN)  # batch rows × time steps per block
    span = min(T, steps)  # time steps per block
    rows = max(1, steps // span)  # batch rows per block
    times = []
    for t in range(0, T, span):
        length = min(span, T - t)
        times.append((slice(t, t + length), min(chunk or math.ceil(math.sqrt(length)), length)))
    return [(slice(r, r + rows), times) for r in range(0, b, rows)]


def _largest_block(blocks: Blocks, b: int, DN: int) -> int:
    """State elements of the largest block, chunks padded to full length."""
    return max(
        len(range(b)[rs]) * -(-(ts.stop - ts.start) // L) * L * DN
        for rs, times in blocks
        for ts, L in times
    )


def _to_chunks(t: Tensor, L: int) -> Tensor:
    """(b, T, K) -> (L, n, b, K): position c·L + j at [j, c], zeros after T (a step with
    Δ = 0 has a = 1 and b = 0: the padding leaves the state as it was)."""
    b, T, K = t.shape
    n = -(-T // L)
    if n * L > T:
        t = F.pad(t, (0, 0, 0, n * L - T))  # (b, n·L, K)
    return t.reshape(b, n, L, K).permute(2, 1, 0, 3).contiguous()


def _from_chunks(t: Tensor, T: int) -> Tensor:
    """(L, n, b, K) -> (b, T, K), the inverse of :func:`_to_chunks`."""
    L, n, b, K = t.shape
    return t.permute(2, 1, 0, 3).reshape(b, n * L, K)[:, :T]


_SCRATCH = threading.local()  # .buf: the scratch buffer the scans of this thread reuse
SCRATCH_MAX = 2**23  # elements (32 MiB in float32): larger scratch is not kept between calls


def _scratch(rows: int, size: int, like: Tensor) -> Tensor:
    """Scratch (rows, size) for one scan call, like ``like``'s dtype and device. Kept between
    calls (one per thread, up to SCRATCH_MAX elements): a fresh buffer of a few MiB costs a
    page fault per 4 KiB on first touch, every call, forward and backward."""
    n = rows * size
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.numel() < n or buf.dtype != like.dtype or buf.device != like.device:
        buf = like.new_empty(n)
        if n <= SCRATCH_MAX:
            _SCRATCH.buf = buf
    return buf[:n].view(rows, size)


def _place(shape: tuple[int, ...], like: Tensor, work: Tensor | None) -> Tensor:
    """A tensor of ``shape``: the start of the flat buffer ``work``, or new if None. The
    blocks of a scan reuse one buffer: allocating a few MiB anew each time costs page faults
    that take longer than the arithmetic on them."""
    if work is None:
        return like.new_empty(shape)
    return work[: math.prod(shape)].view(shape)


def _chunk_decays(ds: Tensor, A2: Tensor, work: Tensor | None = None) -> Tensor:
    """a_t = exp(Δ_t A) = 2^(Δ_t A log₂e): ds (L, n, b, D), A2 (N, D) -> (L, n, b, N, D)."""
    a = _place((*ds.shape[:-1], *A2.shape), ds, work)
    return torch.mul(A2, ds[..., None, :], out=a).exp2_()


def _chunk_inputs(dus: Tensor, Bs: Tensor, work: Tensor) -> Tensor:
    """b_t = Δ_t x_t B_t: dus (L, n, b, D) = Δ x, Bs (L, n, b, N) -> (L, n, b, N, D)."""
    bx = _place((*Bs.shape, dus.shape[-1]), dus, work)
    return torch.mul(Bs[..., None], dus[..., None, :], out=bx)


def _chunk_ends(a: Tensor, bx: Tensor) -> Tensor:
    """Pass 1: each chunk's last state from a zero start. a, bx (L, n, b, N, D) -> (n, b, N, D)."""
    a_, bx_ = a.unbind(0), bx.unbind(0)  # L views (n, b, N, D) each
    h, out = bx_[0], torch.empty_like(bx_[0])  # (n, b, N, D); bx itself is not written
    for a_j, b_j in zip(a_[1:], bx_[1:]):
        h = torch.addcmul(b_j, a_j, h, out=out)
    return h


def _starts(ends: Tensor, decay: Tensor, h0: Tensor) -> Tensor:
    """Pass 2: H_0 = h0, H_{c+1} = decay_c H_c + ends_c. ends, decay (n, b, N, D), h0 (b, N, D)
    -> the n + 1 states before each chunk and after the last (n + 1, b, N, D)."""
    H = ends.new_empty(ends.shape[0] + 1, *ends.shape[1:])
    H[0] = h0
    for c, (end, dec) in enumerate(zip(ends.unbind(0), decay.unbind(0))):
        torch.addcmul(end, dec, H[c], out=H[c + 1])
    return H


def _chunk_states(a: Tensor, bx: Tensor, H: Tensor) -> Tensor:
    """Pass 3: every state, each chunk from its start H (n, b, N, D); written over bx."""
    h = H
    for a_j, b_j in zip(a.unbind(0), bx.unbind(0)):
        h = torch.addcmul(b_j, a_j, h, out=b_j)
    return bx


def _block_forward(
    us: Tensor,
    ds: Tensor,
    A2: Tensor,
    Bs: Tensor,
    Cs: Tensor,
    decay: Tensor,
    h: Tensor,
    work: Tensor,
) -> tuple[Tensor, Tensor]:
    """One block by the three passes, in the chunk layout of :func:`_to_chunks`: us, ds
    (L, n, b, D) x and Δ; A2 (N, D) = A log₂e; Bs, Cs (L, n, b, N); decay (n, b, N, D) each
    chunk's exp(A ΣΔ); h (b, N, D) the state before it; work (2, ≥ block) scratch
    -> y (L, n, b, D) and the states H (n + 1, b, N, D) before each chunk and after the last."""
    a, bx = _chunk_decays(ds, A2, work[0]), _chunk_inputs(ds * us, Bs, work[1])  # (L, n, b, N, D)
    H = _starts(_chunk_ends(a, bx), decay, h)  # (n + 1, b, N, D)
    hs = _chunk_states(a, bx, H[:-1])  # (L, n, b, N, D)
    return torch.matmul(Cs[..., None, :], hs)[..., 0, :], H  # C_t h_t (L, n, b, D)


def _block_backward(
    us: Tensor,
    ds: Tensor,
    A_t: Tensor,
    A2: Tensor,
    Bs: Tensor,
    Cs: Tensor,
    decay: Tensor,
    H: Tensor,
    gys: Tensor,
    G: Tensor,
    work: Tensor,
) -> tuple[Tensor, ...]:
    """Gradients of one block: the states recomputed from H (pass 3), the adjoint in the same
    three passes reversed, then the local derivatives ∂a/∂(ΔA) = a, b = Δ x B. In the chunk
    layout: us, ds, gys (L, n, b, D) x, Δ and ∂y; A_t (N, D) and A2 = A_t log₂e; Bs, Cs
    (L, n, b, N); decay (n, b, N, D) and H as the forward pass had them; G (b, N, D) the
    gradient of the state after the block; work (3, ≥ block) scratch -> the gradients of x,
    delta (L, n, b, D), A (N, D), B, C (L, n, b, N), the state before it (b, N, D)."""
    a = _chunk_decays(ds, A2, work[0])  # (L, n, b, N, D)
    dus = ds * us  # (L, n, b, D)  Δ x
    hs = _chunk_states(a, _chunk_inputs(dus, Bs, work[1]), H[:-1])  # (L, n, b, N, D)
    # Σ_d as (1, D) × (D, N) products: one read of the states, no (L, n, b, N, D) temporary
    gC = torch.matmul(gys[..., None, :], hs.transpose(-1, -2))[..., 0, :]  # (L, n, b, N)
    g = torch.mul(Cs[..., None], gys[..., None, :], out=_place(hs.shape, hs, work[2]))  # C_t ∂y_t
    G = _adjoint_ends(a, g, decay, G)  # (n + 1, b, N, D)
    g = _adjoint_states(a, g, G[1:])  # (L, n, b, N, D)  ∂/∂h_t
    g_la = a.mul_(g)  # (L, n, b, N, D)  ∂/∂(Δ A) = g a h_{t−1}, written over a
    g_la[1:].mul_(hs[:-1])
    g_la[0].mul_(H[:-1])
    gB = torch.matmul(dus[..., None, :], g.transpose(-1, -2))[..., 0, :]  # (L, n, b, N)
    gBx = torch.matmul(Bs[..., None, :], g)[..., 0, :]  # (L, n, b, D)  Σ_n B g
    gd = torch.mul(g_la, A_t, out=hs).sum(3).addcmul_(gBx, us)  # (L, n, b, D), over hs
    gA = g_la.mul_(ds[..., None, :]).sum((0, 1, 2))  # (N, D)
    return gBx.mul_(ds), gd, gA, gB, gC, G[0]


class _ChunkedScan(torch.autograd.Function):
    """Forward: block by block (:func:`_blocks`), each by the three passes, keeping the
    states before its chunks. Backward: the blocks in reverse, each recomputed and run
    through the adjoint (:func:`_block_backward`). The inputs are put in the chunk layout
    once per stretch of time, all batch rows together (a block works on a group of rows of
    it), and the outputs leave it the same way. Inside a block everything is laid out
    (L, n, b, N, D), D contiguous, in scratch buffers that every block reuses (and every
    call, see :func:`_scratch`): two in the forward (a, the states), three in the backward
    (a, the states, the adjoint), which also writes its products over them (recomputing
    measured faster than keeping a and the states from the forward pass, even at T = 64:
    by the backward pass they are out of the cache)."""

    @staticmethod
    def forward(ctx, x, delta, A, B, C, h0, chunk, block):
        A2 = A.t().contiguous() * LOG2E  # (N, D), contiguous: the broadcasts below run fast
        y, h_last, starts = torch.empty_like(x), torch.empty_like(h0), []  # (b, T, D), (b, D, N)
        ctx.blocks = _blocks(x.shape[0], x.shape[1], A.numel(), block, chunk)
        work = _scratch(2, _largest_block(ctx.blocks, x.shape[0], A.numel()), x)
        times = ctx.blocks[0][1]  # every group of rows has the same stretches of time
        ins = [[_to_chunks(t[:, ts], L) for t in (x, delta, B, C)] for ts, L in times]
        decays = [_chunk_decays(ds.sum(0), A2) for _, ds, *_ in ins]  # (n, b, N, D) each
        ys = [x.new_empty(*u.shape) for u, *_ in ins]  # (L, n, b, D) per stretch
        for rs, _ in ctx.blocks:
            h = h0[rs].transpose(1, 2)  # (rows, N, D)
            for k, (us, ds, Bs, Cs) in enumerate(ins):
                y_k, H = _block_forward(
                    *(us[:, :, rs], ds[:, :, rs], A2, Bs[:, :, rs], Cs[:, :, rs]),
                    *(decays[k][:, rs], h, work),
                )
                ys[k][:, :, rs] = y_k
                h = H[-1]
                starts.append(H)
            h_last[rs] = h.transpose(1, 2)
        for (ts, _), y_k in zip(times, ys):
            y[:, ts] = _from_chunks(y_k, ts.stop - ts.start)
        ctx.save_for_backward(x, delta, A, B, C, *starts)
        return y, h_last

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy, gh):
        x, delta, A, B, C, *starts = ctx.saved_tensors
        A_t = A.t().contiguous()  # (N, D)
        A2 = A_t * LOG2E
        gy = torch.zeros_like(x) if gy is None else gy  # (b, T, D)
        gh = x.new_zeros(x.shape[0], *A.shape) if gh is None else gh  # (b, D, N)
        gx, gd, gB, gC, gh0 = (torch.empty_like(t) for t in (x, delta, B, C, gh))
        gA = torch.zeros_like(A_t)  # (N, D)
        work = _scratch(3, _largest_block(ctx.blocks, x.shape[0], A.numel()), x)
        times = ctx.blocks[0][1]
        ins = [[_to_chunks(t[:, ts], L) for t in (x, delta, B, C, gy)] for ts, L in times]
        decays = [_chunk_decays(ds.sum(0), A2) for _, ds, *_ in ins]  # (n, b, N, D) each
        outs = [
            [x.new_empty(*u.shape), x.new_empty(*u.shape), x.new_empty(*b_.shape), None]
            for u, _, b_, *_ in ins
        ]  # gx, gd, gB, gC per stretch, (L, n, b, ·)
        for rs, _ in reversed(ctx.blocks):
            G = gh[rs].transpose(1, 2)  # (rows, N, D) ∂/∂(state after the stretch)
            for k in reversed(range(len(times))):
                us, ds, Bs, Cs, gys = (t[:, :, rs] for t in ins[k])
                *grads, gA_k, gB_k, gC_k, G = _block_backward(
                    *(us, ds, A_t, A2, Bs, Cs, decays[k][:, rs], starts.pop(), gys, G, work)
                )
                out = outs[k]
                if out[3] is None:
                    out[3] = gC_k.new_empty(*ins[k][3].shape)
                out[0][:, :, rs], out[1][:, :, rs] = grads
                out[2][:, :, rs], out[3][:, :, rs] = gB_k, gC_k
                gA += gA_k
            gh0[rs] = G.transpose(1, 2)
        for (ts, _), out in zip(times, outs):
            for full, part in zip((gx, gd, gB, gC), out):
                full[:, ts] = _from_chunks(part, ts.stop - ts.start)
        return gx, gd, gA.t(), gB, gC, gh0, None, None


def _adjoint_ends(a: Tensor, g: Tensor, decay: Tensor, g_end: Tensor) -> Tensor:
    """The adjoint's passes 1 and 2: G_c = ∂/∂(state before chunk c), from G_n = g_end, the
    gradient of the last state. Pass 1 runs g_t = c_t + a_{t+1} g_{t+1} inside each chunk from
    zero at its end, keeping a_0 g_0; pass 2: G_c = a_0 g_0 + decay_c G_{c+1}.
    a, g (L, n, b, N, D) with g = C ∂y; decay (n, b, N, D) -> (n + 1, b, N, D)."""
    a_, g_ = a.unbind(0), g.unbind(0)  # L views (n, b, N, D) each
    s, out = g_[-1], torch.empty_like(g_[-1])  # (n, b, N, D); g itself is not written
    for j in range(len(g_) - 2, -1, -1):
        s = torch.addcmul(g_[j], a_[j + 1], s, out=out)
    s = torch.mul(s, a_[0], out=out)
    G = s.new_empty(s.shape[0] + 1, *s.shape[1:])
    G[-1] = g_end
    for c in range(s.shape[0] - 1, -1, -1):
        torch.addcmul(s[c], decay[c], G[c + 1], out=G[c])
    return G


def _adjoint_states(a: Tensor, g: Tensor, G_next: Tensor) -> Tensor:
    """The adjoint's pass 3, written over g: ∂/∂h_t for every t, the chunk's end fed by
    G_next (n, b, N, D), the gradient of the state after it."""
    a_, g_ = a.unbind(0), g.unbind(0)  # L views (n, b, N, D) each
    g_[-1].add_(G_next)
    for j in range(len(g_) - 2, -1, -1):
        torch.addcmul(g_[j], a_[j + 1], g_[j + 1], out=g_[j])
    return g


def _check_scan_shapes(x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor) -> None:
    if x.dim() != 3 or delta.shape != x.shape:
        raise ValueError(
            f"x and delta must both be (batch, T, D), got {tuple(x.shape)}, {tuple(delta.shape)}"
        )
    want = (x.shape[0], x.shape[1], A.shape[1])
    if A.shape[0] != x.shape[2] or tuple(B.shape) != want or tuple(C.shape) != want:
        raise ValueError(
            f"with x {tuple(x.shape)}: A must be (D, N) = ({x.shape[2]}, N), B and C "
            f"(batch, T, N); got A {tuple(A.shape)}, B {tuple(B.shape)}, C {tuple(C.shape)}"
        )


# --------------------------------------------------------------------------- the block


class _CausalConv(torch.autograd.Function):
    """The depthwise causal convolution as K shifted multiply-adds along time, with its
    backward written out (autograd's, op by op, zero-fills and adds a full-size gradient for
    every shifted slice): full (B, K − 1 + T, Di), w (K, Di) contiguous, bias (Di,) or None
    -> out (B, T, Di), out_t = bias + Σ_k w_k ⊙ full_{t+k} (the cross-correlation F.conv1d
    computes)."""

    @staticmethod
    def forward(ctx, full, w, bias):
        K = w.shape[0]
        T = full.shape[1] - K + 1
        ctx.save_for_backward(full, w)
        ctx.has_bias = bias is not None
        out = (
            full[:, K - 1 :] * w[K - 1]
            if bias is None
            else torch.addcmul(bias, full[:, K - 1 :], w[K - 1])
        )  # (B, T, Di) the newest tap
        for k in range(K - 1):
            out.addcmul_(full[:, k : k + T], w[k])
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        full, w = ctx.saved_tensors
        K, T = w.shape[0], g.shape[1]
        g_full = torch.empty_like(full)  # (B, K − 1 + T, Di)
        g_full[:, : K - 1].zero_()
        torch.mul(g, w[K - 1], out=g_full[:, K - 1 :])
        for k in range(K - 1):
            g_full[:, k : k + T].addcmul_(g, w[k])
        g_w = torch.stack([(g * full[:, k : k + T]).sum((0, 1)) for k in range(K)])  # (K, Di)
        return g_full, g_w, g.sum((0, 1)) if ctx.has_bias else None


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
            raise ValueError(f"{name} must be >= {low}, got {value}")


class MambaBlock(nn.Module):
    is_attention = True  # `record_attention` names its hidden attention (``hidden_attention``)
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
        chunk: int = 0,
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
        self.view_heads = 4  # channel groups shown as heads by `attnlab explore`
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
    def init_weights(self, std: float = 0.02, out_std: float | None = None) -> None:
        """Initialise as one layer of a GPT-2-style stack (the mixer interface the GPT calls):
        in_proj and x_proj N(0, std), out_proj N(0, out_std or std), biases zero; then Mamba's
        own SSM initialisation (:meth:`reset_ssm_parameters`). The convolution keeps PyTorch's
        default."""
        for lin in (self.in_proj, self.x_proj, self.out_proj):
            nn.init.normal_(lin.weight, std=std)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        self.out_proj.weight.normal_(0.0, std if out_std is None else out_std)
        self.reset_ssm_parameters()

    @torch.no_grad()
    def reset_ssm_parameters(
        self, dt_min: float = 1e-3, dt_max: float = 0.1, dt_floor: float = 1e-4
    ) -> None:
        """Mamba's initialisation of the SSM parameters (Gu & Dao 2023, §3.6 and appendix):
        A = −(1, 2, ..., N) per channel (S4D-real), D = 1, Δ's bias so that softplus(bias) is
        log-uniform in [dt_min, dt_max], dt_proj's weight uniform in ±R^(−1/2)."""
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
        d_conv − 1 inputs before u (zeros at the start) and is updated with u's last ones.
        The convolution is K shifted multiply-adds, out_t = bias + Σ_k w_k ⊙ u_{t−K+1+k}
        (the cross-correlation F.conv1d computes), along time in the (B, T, Di) layout."""
        B, T, Di = u.shape
        K = self.d_conv
        if cache is not None and cache.conv is not None:
            past = cache.conv.transpose(1, 2)  # (B, K-1, Di)
        else:
            past = u.new_zeros(B, K - 1, Di)  # (B, K-1, Di)
        full = torch.cat([past, u], dim=1)  # (B, K-1+T, Di)
        if cache is not None:
            cache.conv = full[:, T:].transpose(1, 2).detach()  # (B, Di, K-1)
        # (K, Di): each tap's weights contiguous (a strided (Di,) operand broadcast over
        # (B, T, Di) takes the slow, unvectorised path, forward and backward)
        w = self.conv1d.weight[:, 0].t().contiguous()
        return F.silu(_CausalConv.apply(full, w, self.conv1d.bias))  # (B, T, Di)

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
        h0 = cache.ssm if cache is not None else None  # (B, Di, N) or None
        # The scan runs in float32 at least, outside autocast (as the reference kernels do):
        # a state summed over thousands of steps in bf16 would lose most of its digits.
        dtype = torch.promote_types(u.dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):
            u, delta, B, C = (t.to(dtype) for t in (u, delta, B, C))
            A = -torch.exp(self.A_log.to(dtype))  # (Di, N)
            if h0 is not None and T == 1:
                y, h = selective_step(u[:, 0], delta[:, 0], A, B[:, 0], C[:, 0], h0)
                y = y[:, None]  # (B, 1, Di)
            else:
                y, h = self._scan_fn()(u, delta, A, B, C, h0)  # (B, T, Di), (B, Di, N)
            if is_recording() and h0 is None:  # shown as |α|, each row scaled to sum to 1
                alpha = hidden_attention(delta, A, B, C).abs()  # (B, Di, T, T)
                alpha = alpha / alpha.sum(dim=-1, keepdim=True).clamp_min(1e-30)
                record_mixer_weights(channel_groups(alpha, self.view_heads))
        if cache is not None:
            cache.ssm = h.detach()
            cache.length += T
        y = (y + u * self.D) * F.silu(z)  # (B, T, Di)
        return self.out_proj(y)  # (B, T, d_model)

    def _scan_fn(self) -> Callable[..., tuple[Tensor, Tensor]]:
        if self.scan == "sequential":
            return selective_scan_sequential
        return lambda *args: selective_scan_fast(*args, chunk=self.chunk)


def selective_scan_fast(
    x: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    h0: Tensor | None = None,
    chunk: int = 0,
) -> tuple[Tensor, Tensor]:
    """The scan the block's ``scan = "chunked"`` runs: the fused C++ kernel
    (:mod:`attnlab.layers.ssm_cpp`) for CPU float32/float64 tensors when it built and
    ``ATTNLAB_EAGER_SCAN=1`` is not set, else :func:`selective_scan_chunked`. Both compute the
    function of :func:`selective_scan_sequential`; same shapes in and out."""
    _check_scan_shapes(x, delta, A, B, C)
    if usable(x):
        return selective_scan_compiled(x, delta, A, B, C, h0)
    return selective_scan_chunked(x, delta, A, B, C, h0, chunk=chunk)
