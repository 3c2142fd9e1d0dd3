"""FlashAttention written by hand: tiled attention with the online softmax, and the
FlashAttention-2 backward by recomputation (Dao et al. 2022; Dao 2023, Algorithms 1 and 2).

Forward. The queries are cut into blocks of ``block_q`` rows, the keys and values into blocks
of ``block_k``. For one query block, the key blocks are visited in turn, keeping per row a
running maximum m, a running sum ℓ and an unnormalised output O:

    S   = Q_i K_jᵀ · scale                        (block_q, block_k) scores of this tile
    m'  = max(m, rowmax(S))
    P   = exp(S − m')                             masked entries are exp(−∞) = 0
    ℓ'  = exp(m − m') ℓ + rowsum(P)
    O'  = exp(m − m') O + P V_j

After the last block O / ℓ is the softmax output and L = m + log ℓ the log-sum-exp of each row.
The rescale is exact: every term in ℓ and O carries the factor exp(−m) of the maximum it was
computed with, and multiplying by exp(m − m') swaps that factor for exp(−m'), so after the last
block every term carries exp(−max of the row), which O / ℓ cancels (docs/inference.md). The
T×T score matrix is never formed: the memory besides q, k, v, O is one tile.

Backward (by recomputation). Only O and L are saved. With D = rowsum(dO ∘ O), each tile is
recomputed as P = exp(S − L) and

    dV_j += Pᵀ dO_i,   dP = dO_i V_jᵀ,   dS = P ∘ (dP − D_i),
    dQ_i += dS K_j · scale,   dK_j += dSᵀ Q_i · scale.

Conventions are those of :func:`attnlab.layers.attention.scaled_dot_product_attention`: q, k, v of
shape (…, T, d) with any leading dimensions (the third from the end is the head dimension when
there are four or more, and k, v may have fewer heads: grouped-query attention, by repeating
each key/value head), a boolean ``mask`` where True means *may attend* read by
:func:`attnlab.layers.shapes.normalize_mask`, ``is_causal`` aligned bottom-right, and a row with
nothing to attend to gives zeros and zero gradients. Tiles entirely above the causal diagonal
are skipped. This is the algorithm, written in PyTorch tensor operations; it is memory-lean, not
fast (a loop over tiles in Python), which is why the fused kernel stays the default. Models
reach it as the ``"flash"`` backend of :func:`attnlab.layers.attention.scaled_dot_product_attention`
(``backend = "flash"`` in a model config); calls with an additive bias or dropout then run on
the fused kernel.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from attnlab.layers.shapes import as_4d, check_mask, check_qkv

BLOCK_Q = 128
BLOCK_K = 128


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> Tensor:
    """softmax(Q Kᵀ · scale, masked) V by tiles (module docstring); returns (…, Tq, Dv).

    q (…, Tq, Dk), k (…, Tk, Dk), v (…, Tk, Dv); ``mask`` bool, True = may attend;
    ``scale`` defaults to 1/√Dk; ``block_q``/``block_k`` are the tile sizes (any T works,
    the last tile is shorter). Differentiable in q, k and v.
    """
    check_qkv(q, k, v, is_causal)
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be >= 1, got block_q={block_q}, block_k={block_k}")
    n, Tk = q.dim(), k.shape[-2]
    target = (*q.shape[:-1], Tk)  # (…, Tq, Tk)
    if mask is not None:
        mask = check_mask(mask, target)
    q4, k4, v4 = (as_4d(t, n) for t in (q, k, v))  # (N, H, T, D)
    mask4 = None if mask is None else as_4d(mask, n, q.shape[:-3])
    H, Hkv = q4.shape[1], k4.shape[1]
    if H % Hkv != 0 or v4.shape[1] != Hkv:
        raise ValueError(
            f"query heads ({H}) must be a multiple of key/value heads (k: {Hkv}, v: {v4.shape[1]})"
        )
    if Hkv != H:  # grouped-query attention: share each key/value head among H / Hkv heads
        k4 = k4.repeat_interleave(H // Hkv, dim=1)  # (N, H, Tk, Dk)
        v4 = v4.repeat_interleave(H // Hkv, dim=1)  # (N, H, Tk, Dv)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = _Flash.apply(q4, k4, v4, mask4, is_causal, scale, block_q, block_k)  # (N, H, Tq, Dv)
    return out.reshape(*q.shape[:-1], v.shape[-1])  # (…, Tq, Dv)


def _tiles(
    Tq: int, Tk: int, block_q: int, block_k: int, causal: bool
) -> list[tuple[int, int, list[tuple[int, int, bool]]]]:
    """(i0, i1, [(j0, j1, needs causal mask)]) per query block; tiles above the diagonal left out.

    Query i sits at position i + Tk − Tq (bottom-right alignment) and sees keys j <= that.
    """
    offset = Tk - Tq
    plan = []
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        keys = []
        for j0 in range(0, Tk, block_k):
            j1 = min(j0 + block_k, Tk)
            if causal and j0 > i1 - 1 + offset:
                break  # every later key block lies above the diagonal too
            keys.append((j0, j1, causal and j1 - 1 > i0 + offset))
        plan.append((i0, i1, keys))
    return plan


def _tile_mask(
    mask: Tensor | None, i0: int, i1: int, j0: int, j1: int, causal: bool, offset: int
) -> Tensor | None:
    """The may-attend mask of one tile (B|1, H|1, bq|1, bk|1), or None when all may attend."""
    tile = None
    if mask is not None:
        rows = slice(i0, i1) if mask.shape[-2] > 1 else slice(None)
        cols = slice(j0, j1) if mask.shape[-1] > 1 else slice(None)
        tile = mask[..., rows, cols]
    if causal:
        device = mask.device if mask is not None else None
        i = torch.arange(i0, i1, device=device)[:, None] + offset  # (bq, 1) positions
        j = torch.arange(j0, j1, device=device)[None, :]  # (1, bk)
        below = j <= i  # (bq, bk)
        tile = below if tile is None else tile & below
    return tile


class _Flash(torch.autograd.Function):
    """Tiled forward; backward recomputes each tile from q, k, v, O and the log-sum-exp."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        causal: bool,
        scale: float,
        block_q: int,
        block_k: int,
    ) -> Tensor:
        B, H, Tq, _ = q.shape
        Tk, Dv = k.shape[2], v.shape[3]
        offset = Tk - Tq
        out = q.new_zeros(B, H, Tq, Dv)  # (B, H, Tq, Dv)
        lse = q.new_full((B, H, Tq), -math.inf)  # (B, H, Tq)
        for i0, i1, keys in _tiles(Tq, Tk, block_q, block_k, causal):
            q_i = q[:, :, i0:i1]  # (B, H, bq, Dk)
            m = q.new_full((B, H, i1 - i0, 1), -math.inf)  # running max
            ell = q.new_zeros(B, H, i1 - i0, 1)  # running sum
            acc = q.new_zeros(B, H, i1 - i0, Dv)  # running unnormalised output
            for j0, j1, diagonal in keys:
                s = torch.matmul(q_i, k[:, :, j0:j1].transpose(-2, -1)) * scale  # (B, H, bq, bk)
                tile = _tile_mask(mask, i0, i1, j0, j1, diagonal, offset)
                if tile is not None:
                    s = s.masked_fill(~tile, -math.inf)
                m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (B, H, bq, 1)
                m_safe = m_new.masked_fill(m_new == -math.inf, 0.0)  # rows with no key yet
                p = torch.exp(s - m_safe)  # (B, H, bq, bk), masked -> 0
                alpha = torch.exp(m - m_safe)  # (B, H, bq, 1) the one rescale of this block
                ell = alpha * ell + p.sum(dim=-1, keepdim=True)
                acc = alpha * acc + torch.matmul(p, v[:, :, j0:j1])  # (B, H, bq, Dv)
                m = m_new
            seen = ell > 0  # rows with at least one key they may attend to
            out[:, :, i0:i1] = torch.where(seen, acc / ell.clamp_min(1e-300), 0.0)
            lse[:, :, i0:i1] = torch.where(seen, m + torch.log(ell), -math.inf)[..., 0]
        ctx.save_for_backward(q, k, v, out, lse, *(() if mask is None else (mask,)))
        ctx.settings = (mask is not None, causal, scale, block_q, block_k)
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        has_mask, causal, scale, block_q, block_k = ctx.settings
        q, k, v, out, lse, *rest = ctx.saved_tensors
        mask = rest[0] if has_mask else None
        Tq, Tk = q.shape[2], k.shape[2]
        offset = Tk - Tq
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (d_out * out).sum(dim=-1, keepdim=True)  # (B, H, Tq, 1) D = rowsum(dO ∘ O)
        lse_safe = lse.masked_fill(lse == -math.inf, math.inf)[..., None]  # empty rows: P = 0
        for i0, i1, keys in _tiles(Tq, Tk, block_q, block_k, causal):
            q_i, do_i = q[:, :, i0:i1], d_out[:, :, i0:i1]  # (B, H, bq, ·)
            for j0, j1, diagonal in keys:
                k_j, v_j = k[:, :, j0:j1], v[:, :, j0:j1]  # (B, H, bk, ·)
                s = torch.matmul(q_i, k_j.transpose(-2, -1)) * scale  # (B, H, bq, bk)
                p = torch.exp(s - lse_safe[:, :, i0:i1])  # (B, H, bq, bk) recomputed softmax
                tile = _tile_mask(mask, i0, i1, j0, j1, diagonal, offset)
                if tile is not None:
                    p = p.masked_fill(~tile, 0.0)
                dv[:, :, j0:j1] += torch.matmul(p.transpose(-2, -1), do_i)  # (B, H, bk, Dv)
                dp = torch.matmul(do_i, v_j.transpose(-2, -1))  # (B, H, bq, bk)
                ds = p * (dp - delta[:, :, i0:i1])  # (B, H, bq, bk)
                dq[:, :, i0:i1] += torch.matmul(ds, k_j) * scale  # (B, H, bq, Dk)
                dk[:, :, j0:j1] += torch.matmul(ds.transpose(-2, -1), q_i) * scale
        return dq, dk, dv, None, None, None, None, None
