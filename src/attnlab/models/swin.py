"""Swin Transformer (Liu et al. 2021): windowed self-attention, shifted windows, patch merging.

What it changes relative to the core pieces: the blocks are pre-norm blocks made of the same
:class:`attnlab.layers.blocks.BlockConfig` parts as the ViT (``self_attention()``,
``feed_forward()``, ``make_norm()``), but attention runs inside non-overlapping M × M windows of
the token grid (§3.2, W-MSA): the grid is cut into windows, each window is a batch row of
:class:`~attnlab.layers.attention.MultiHeadAttention`, and a learned relative position bias B is
added to every head's scores, Attention(Q, K, V) = SoftMax(QKᵀ/√d + B)V  (eq. 4), B read from a
table of (2M−1)² entries per head. Every second block shifts the grid by ⌊M/2⌋ before cutting
(SW-MSA, eq. 3) with a cyclic roll; a boolean mask keeps tokens that were not neighbours before
the roll from attending to each other. Between stages, patch merging concatenates each 2 × 2
group of tokens (4C), normalises and projects to 2C, halving the resolution. A window larger
than the grid is clamped to the grid with no shift (as in the paper's code), and a grid that is
not a multiple of the window is zero-padded after the norm (as in the reference code; the
padded tokens are attended to, not masked).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.configs import ConfigBase, setting
from attnlab.errors import UserError
from attnlab.layers.blocks import (
    Activation,
    BlockConfig,
    NormKind,
    block_setting,
    check_dyt_alpha0,
    make_norm,
)
from attnlab.models.registry import images, register_model
from attnlab.models.vit import PatchEmbedding, init_vit_weights


@dataclass
class SwinConfig(ConfigBase):
    """Shape of a Swin; ``n_classes`` and the image shape are filled in from the data."""

    image_size: int = setting(28, min=1)
    in_channels: int = setting(1, min=1)
    patch_size: int = setting(2, min=1)
    d_model: int = setting(48, "width C of the first stage; each later stage doubles it", min=1)
    depths: tuple[int, ...] = setting((2, 2), "blocks per stage, e.g. 2,2")
    stage_heads: tuple[int, ...] = setting((3, 6), "attention heads per stage, e.g. 3,6")
    window: int = setting(7, "window side M (tokens); clamped to a smaller grid", min=1)
    mlp_ratio: float = setting(4.0, "feed-forward width = mlp_ratio · stage width", min=0.1)
    dropout: float = block_setting("dropout", 0.1)
    attn_dropout: float = block_setting("attn_dropout", 0.0)
    activation: Activation = block_setting("activation", "gelu")
    norm: NormKind = block_setting("norm", "layer")
    dyt_alpha0: float = block_setting("dyt_alpha0")
    norm_eps: float = block_setting("norm_eps", 1e-5)
    n_classes: int = setting(10, min=2)

    def check(self) -> None:
        if self.image_size % self.patch_size:
            raise UserError(
                f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}"
            )
        if len(self.depths) != len(self.stage_heads) or not self.depths:
            raise UserError(
                f"depths {self.depths} and stage_heads {self.stage_heads} need one entry per stage"
            )
        for i, (depth, heads) in enumerate(zip(self.depths, self.stage_heads)):
            if depth < 1 or heads < 1 or self.stage_width(i) % heads:
                raise UserError(
                    f"stage {i + 1}: width {self.stage_width(i)} with {heads} heads and depth "
                    f"{depth}; depths and heads must be >= 1 and heads must divide the width"
                )
        check_dyt_alpha0(self.norm, self.dyt_alpha0)

    @property
    def grid(self) -> int:
        """Patches per side in the first stage."""
        return self.image_size // self.patch_size

    def stage_width(self, i: int) -> int:
        return self.d_model * 2**i

    def stage_resolution(self, i: int) -> int:
        """Tokens per side in stage ``i`` (patch merging rounds odd sides up, as it pads)."""
        side = self.grid
        for _ in range(i):
            side = (side + 1) // 2
        return side

    def block_config(self, i: int) -> BlockConfig:
        """The block parts of stage ``i``."""
        width = self.stage_width(i)
        return BlockConfig(
            d_model=width,
            n_heads=self.stage_heads[i],
            d_ff=int(self.mlp_ratio * width),
            activation=self.activation,
            norm=self.norm,
            norm_position="pre",
            norm_eps=self.norm_eps,
            dyt_alpha0=self.dyt_alpha0,
            dropout=self.dropout,
            attn_dropout=self.attn_dropout,
        )


def window_partition(x: Tensor, window: int) -> Tensor:
    """(B, H, W, C) -> (B · nW, M·M, C), windows row-major, tokens row-major in each."""
    B, H, W, C = x.shape
    x = x.view(B, H // window, window, W // window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window * window, C)  # (B·nW, M², C)


def window_reverse(windows: Tensor, window: int, height: int, width: int) -> Tensor:
    """(B · nW, M·M, C) -> (B, H, W, C): the inverse of :func:`window_partition`."""
    C = windows.shape[-1]
    x = windows.view(-1, height // window, width // window, window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, height, width, C)  # (B, H, W, C)


def shifted_window_mask(height: int, width: int, window: int, shift: int) -> Tensor:
    """Bool (nW, M², M²), True = may attend: after rolling the grid by −shift, tokens of one
    window may attend to each other only if they came from the same region of the unrolled
    grid (3 regions per axis: [0, H−M), [H−M, H−shift), [H−shift, H)), Swin §3.2."""

    def regions(n: int) -> Tensor:
        idx = torch.arange(n)
        return (idx >= n - window).long() + (idx >= n - shift).long()  # (n,)

    label = regions(height)[:, None] * 3 + regions(width)[None, :]  # (H, W)
    label = window_partition(label[None, :, :, None], window)[..., 0]  # (nW, M²)
    return label[:, :, None] == label[:, None, :]  # (nW, M², M²)


def relative_position_index(window: int) -> Tensor:
    """(M², M²) index into the (2M−1)² table: (Δrow + M−1)·(2M−1) + (Δcol + M−1)."""
    coords = torch.stack(
        torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
    ).flatten(1)  # (2, M²)
    rel = coords[:, :, None] - coords[:, None, :] + (window - 1)  # (2, M², M²)
    return rel[0] * (2 * window - 1) + rel[1]


class RelativePositionBias(nn.Module):
    """B of Swin's eq. 4: a learned ((2M−1)², H) table read at each (query, key) offset."""

    def __init__(self, window: int, n_heads: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, n_heads))
        nn.init.trunc_normal_(self.table, std=0.02)
        self.register_buffer("index", relative_position_index(window), persistent=False)

    def forward(self) -> Tensor:
        return self.table[self.index].permute(2, 0, 1)[None]  # (1, H, M², M²)


class SwinBlock(nn.Module):
    """x + W-MSA(Norm(x)) then x + FFN(Norm(x)); windows shifted by ``shift`` when > 0."""

    def __init__(self, cfg: BlockConfig, resolution: int, window: int, shift: int) -> None:
        super().__init__()
        if resolution <= window:  # one window covers the grid: nothing to shift
            window, shift = resolution, 0
        self.resolution, self.window, self.shift = resolution, window, shift
        self.padded = -(-resolution // window) * window
        self.norm1 = cfg.make_norm()
        self.self_attn = cfg.self_attention(None)
        self.rel_bias = RelativePositionBias(window, cfg.n_heads)
        self.norm2 = cfg.make_norm()
        self.ff = cfg.feed_forward()
        self.dropout1 = nn.Dropout(cfg.dropout)
        self.dropout2 = nn.Dropout(cfg.dropout)
        mask = shifted_window_mask(self.padded, self.padded, window, shift) if shift else None
        self.register_buffer("mask", mask, persistent=False)  # (nW, M², M²) or None

    @property
    def n_windows(self) -> int:
        return (self.padded // self.window) ** 2

    def forward(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x: (B, R·R, C) -> (B, R·R, C) and weights (B, nW, H, M², M²) when asked."""
        B, _, C = x.shape
        R, P, M = self.resolution, self.padded, self.window
        h = self.norm1(x).view(B, R, R, C)
        h = F.pad(h, (0, 0, 0, P - R, 0, P - R))  # (B, P, P, C)
        if self.shift:
            h = torch.roll(h, shifts=(-self.shift, -self.shift), dims=(1, 2))
        windows = window_partition(h, M)  # (B·nW, M², C)
        mask = None
        if self.mask is not None:
            mask = self.mask.repeat(B, 1, 1)[:, None]  # (B·nW, 1, M², M²)
        out, weights = self.self_attn(
            windows, mask=mask, bias=self.rel_bias(), need_weights=need_weights
        )  # (B·nW, M², C)
        h = window_reverse(out, M, P, P)  # (B, P, P, C)
        if self.shift:
            h = torch.roll(h, shifts=(self.shift, self.shift), dims=(1, 2))
        h = h[:, :R, :R].reshape(B, R * R, C)
        x = x + self.dropout1(h)
        x = x + self.dropout2(self.ff(self.norm2(x)))
        if weights is not None:
            weights = weights.view(B, self.n_windows, *weights.shape[1:])  # (B, nW, H, M², M²)
        return x, weights


class PatchMerging(nn.Module):
    """(B, R·R, C) -> (B, ⌈R/2⌉², 2C): concat each 2 × 2 group [x00, x10, x01, x11], norm, a
    linear map 4C -> 2C without bias (§3.1); an odd side is zero-padded first."""

    def __init__(self, width: int, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.reduction = nn.Linear(4 * width, 2 * width, bias=False)

    def forward(self, x: Tensor, resolution: int) -> Tensor:
        B, _, C = x.shape
        x = x.view(B, resolution, resolution, C)
        odd = resolution % 2
        x = F.pad(x, (0, 0, 0, odd, 0, odd))
        x = torch.cat([x[:, r::2, c::2] for c in range(2) for r in range(2)], dim=-1)
        return self.reduction(self.norm(x.reshape(B, -1, 4 * C)))  # (B, R'², 2C)


class SwinStage(nn.Module):
    """``depth`` blocks alternating plain and shifted windows, then patch merging (not last)."""

    def __init__(self, cfg: SwinConfig, i: int) -> None:
        super().__init__()
        block = cfg.block_config(i)
        self.resolution = cfg.stage_resolution(i)
        self.blocks = nn.ModuleList(
            SwinBlock(block, self.resolution, cfg.window, 0 if j % 2 == 0 else cfg.window // 2)
            for j in range(cfg.depths[i])
        )
        last = i == len(cfg.depths) - 1
        width = cfg.stage_width(i)
        # over the 4C concatenation
        merge_norm = make_norm(cfg.norm, 4 * width, cfg.norm_eps, alpha0=cfg.dyt_alpha0)
        self.merge = None if last else PatchMerging(width, merge_norm)


class Swin(nn.Module):
    """Swin Transformer classifier: patch embedding + norm, stages, norm, mean pool, linear."""

    def __init__(self, cfg: SwinConfig) -> None:
        super().__init__()
        cfg.validate(complete=True)
        self.cfg = cfg
        self.patch_embed = PatchEmbedding(cfg.in_channels, cfg.patch_size, cfg.d_model)
        self.embed_norm = cfg.block_config(0).make_norm()
        self.dropout = nn.Dropout(cfg.dropout)
        self.stages = nn.ModuleList(SwinStage(cfg, i) for i in range(len(cfg.depths)))
        self.norm = cfg.block_config(len(cfg.depths) - 1).make_norm()
        self.head = nn.Linear(cfg.stage_width(len(cfg.depths) - 1), cfg.n_classes)
        self.apply(init_vit_weights)

    def embed(self, images: Tensor) -> Tensor:
        c, s = self.cfg.in_channels, self.cfg.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (c, s, s):
            raise UserError(
                f"images must have shape (B, {c}, {s}, {s}), got {tuple(images.shape)}; "
                "resize them to the model's image_size"
            )
        return self.dropout(self.embed_norm(self.patch_embed(images)))  # (B, G², C)

    def features(self, images: Tensor, need_weights: bool = False) -> dict[str, Any]:
        """Stem and per-stage hidden states (after merging), block attention, final states."""
        x = self.embed(images)
        hidden, weights = [x], []
        for stage in self.stages:
            for block in stage.blocks:
                x, w = block(x, need_weights)
                weights.append(w)
            if stage.merge is not None:
                x = stage.merge(x, stage.resolution)
            hidden.append(x)
        return {"hidden_states": hidden, "attention": weights, "last_hidden_state": self.norm(x)}

    def forward(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> logits (B, n_classes)."""
        out = self.features(images)["last_hidden_state"]  # (B, T, C)
        return self.head(out.mean(dim=1))

    @torch.no_grad()
    def inspect(self, images: Tensor) -> dict[str, Any]:
        """Hidden states, final states, per-block window attention (B, nW, H, M², M²), the
        window geometry of each block and the logits."""
        out = self.features(images, need_weights=True)
        out["logits"] = self.head(out["last_hidden_state"].mean(dim=1))
        out["windows"] = [
            {"resolution": b.resolution, "window": b.window, "shift": b.shift, "padded": b.padded}
            for stage in self.stages
            for b in stage.blocks
        ]
        return out


def dense_window_attention(block: SwinBlock, weights: Tensor) -> tuple[Tensor, Tensor]:
    """One block's window attention (B, nW, H, M², M²) spread over the whole grid: weights
    (B, H, R², R²) between grid tokens (row-major, unshifted coordinates; zero outside a
    query's window) and the bool mask (R², R²) of which keys each query may see."""
    B, _, H = weights.shape[:3]
    R, P, M = block.resolution, block.padded, block.window
    ids = torch.arange(P * P).view(1, P, P, 1)
    if block.shift:
        ids = torch.roll(ids, shifts=(-block.shift, -block.shift), dims=(1, 2))
    ids = window_partition(ids, M)[..., 0]  # (nW, M²): grid index of each window slot
    allowed = block.mask if block.mask is not None else torch.ones(len(ids), M * M, M * M)
    dense = weights.new_zeros(B, H, P * P, P * P)
    mask = torch.zeros(P * P, P * P, dtype=torch.bool)
    for w, slots in enumerate(ids):
        q, k = slots[:, None], slots[None, :]
        dense[:, :, q, k] = weights[:, w]
        mask[q, k] = allowed[w].bool().cpu()
    keep = (torch.arange(R)[:, None] * P + torch.arange(R)[None, :]).flatten()  # real tokens
    return dense[:, :, keep][:, :, :, keep], mask[keep][:, keep]


def attention_received(model: Swin, images: Tensor) -> Tensor:
    """(B, C, H, W) -> (B, G, G): attention each first-stage token receives, averaged over the
    queries of its window, the heads and the first stage's blocks; rows sum to 1."""
    info = model.inspect(images)
    stage = model.stages[0]
    maps = []
    for block, w in zip(stage.blocks, info["attention"][: len(stage.blocks)]):
        dense, _ = dense_window_attention(block, w)  # (B, H, R², R²)
        maps.append(dense.mean(dim=1).sum(dim=1))  # (B, R²): column sums
    share = torch.stack(maps).mean(dim=0)
    share = share / share.sum(dim=-1, keepdim=True)
    return share.view(-1, stage.resolution, stage.resolution)


register_model(
    "swin",
    family="swin",
    config=SwinConfig,
    oracle="Swin",
    also=("Swin attention (f32)",),
    example=images,
    tiny={"image_size": 8, "d_model": 12, "depths": (1, 1), "stage_heads": (2, 2), "window": 2},
)(Swin)
