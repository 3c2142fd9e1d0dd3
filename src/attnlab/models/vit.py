"""Vision Transformer (Dosovitskiy et al. 2021): patches -> tokens -> encoder -> class.

z_0 = [x_cls; x_p^1 E; ...; x_p^N E] + E_pos  (eq. 1), pre-norm encoder blocks (eqs. 2-3),
y = LN(z_L^0)  (eq. 4), then a linear head. The patch projection E is a convolution whose
kernel and stride are the patch size, which is the same as flattening each patch and
multiplying by E.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from attnlab.blocks import Activation, Encoder, EncoderBlock, make_norm
from attnlab.efficient import check_attention_config
from attnlab.positions import sinusoid_table


@dataclass
class ViTConfig:
    """Shape of a ViT; ``n_classes`` and the image shape are filled in from the data."""

    image_size: int = 28
    in_channels: int = 1
    patch_size: int = 4
    d_model: int = 128
    n_layers: int = 6
    n_heads: int = 4
    d_ff: int = 256
    dropout: float = 0.1
    attn_dropout: float = 0.0
    activation: Activation = "gelu"
    norm_eps: float = 1e-6
    pooling: Literal["cls", "mean"] = "cls"
    pos: Literal["learned", "sincos2d"] = "learned"
    stem: Literal["patch", "conv"] = "patch"
    attention: str = "full"  # full | local (sliding window over row-major patches) | linear
    window: int = 0  # attention="local": keys within this distance, itself included
    n_global: int = 0  # attention="local": leading tokens (the class token) seen by and seeing all
    stem_channels: int = 32
    n_classes: int = 10
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        """Reject shapes the model cannot be built with, saying what to change."""
        if self.image_size % self.patch_size != 0:
            raise ValueError(
                f"image_size={self.image_size} is not a multiple of patch_size="
                f"{self.patch_size}; choose a patch size that divides it"
            )
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be cls or mean, got {self.pooling!r}")
        check_attention_config(self.attention, self.window, self.n_global)
        if self.stem not in ("patch", "conv"):
            raise ValueError(f"stem must be patch or conv, got {self.stem!r}")
        if self.stem == "conv" and (self.patch_size & (self.patch_size - 1) or self.patch_size < 2):
            raise ValueError(
                f"stem=conv halves the image per 3x3 stride-2 conv, so patch_size must be a power "
                f"of two >= 2, got {self.patch_size}; use stem=patch for other patch sizes"
            )
        if self.pos not in ("learned", "sincos2d"):
            raise ValueError(f"pos must be learned or sincos2d, got {self.pos!r}")
        if self.pos == "sincos2d" and self.d_model % 4 != 0:
            raise ValueError(f"pos=sincos2d needs d_model divisible by 4, got {self.d_model}")

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def n_tokens(self) -> int:
        """Sequence length: patches plus the class token when pooling is cls."""
        return self.grid**2 + int(self.pooling == "cls")


def sincos_2d_table(grid: int, d_model: int) -> Tensor:
    """Fixed 2-D positions: concat(PE_1d(row), PE_1d(col)), each half D/2 wide  (MAE, ViT-S/16)."""
    table = sinusoid_table(grid, d_model // 2)  # (G, D/2)
    rows = table[:, None, :].expand(grid, grid, -1)  # (G, G, D/2): row index
    cols = table[None, :, :].expand(grid, grid, -1)  # (G, G, D/2): column index
    return torch.cat([rows, cols], dim=-1).reshape(grid * grid, d_model)  # (G², D)


class PatchEmbedding(nn.Module):
    """(B, C, H, W) -> (B, N, D): a Conv2d with kernel = stride = patch, flattened row-major."""

    def __init__(self, in_channels: int, patch_size: int, d_model: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, d_model, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: Tensor) -> Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)  # (B, N, D)


class ConvStem(nn.Module):
    """(B, C, H, W) -> (B, N, D): log2(patch) 3x3 stride-2 conv + BatchNorm + ReLU layers, then a
    1x1 conv to d_model; the same token grid as a patch embedding, but the early convolutions make
    optimisation faster and steadier (Xiao et al. 2021, "Early Convolutions Help Transformers See
    Better", §3)."""

    def __init__(self, in_channels: int, patch_size: int, d_model: int, channels: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in, c_out = in_channels, channels
        for _ in range(patch_size.bit_length() - 1):  # each layer halves H and W
            layers += [
                nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(c_out),
                nn.ReLU(inplace=True),
            ]
            c_in, c_out = c_out, 2 * c_out
        layers.append(nn.Conv2d(c_in, d_model, kernel_size=1))
        self.proj = nn.Sequential(*layers)

    def forward(self, images: Tensor) -> Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)  # (B, N, D)


class ViT(nn.Module):
    """Vision Transformer classifier; ``inspect`` returns hidden states and attention maps."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        if cfg.stem == "conv":
            self.patch_embed: nn.Module = ConvStem(
                cfg.in_channels, cfg.patch_size, cfg.d_model, cfg.stem_channels
            )
        else:
            self.patch_embed = PatchEmbedding(cfg.in_channels, cfg.patch_size, cfg.d_model)
        cls = cfg.pooling == "cls"
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.d_model)) if cls else None
        if cfg.pos == "learned":
            self.pos_embed = nn.Parameter(torch.randn(1, cfg.n_tokens, cfg.d_model) * 0.02)
        else:
            table = sincos_2d_table(cfg.grid, cfg.d_model)  # (N, D)
            if cfg.pooling == "cls":
                table = torch.cat([torch.zeros(1, cfg.d_model), table])  # cls gets no position
            self.register_buffer("pos_embed", table[None], persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)
        blocks = [
            EncoderBlock(
                cfg.d_model,
                cfg.n_heads,
                cfg.d_ff,
                dropout=cfg.dropout,
                attn_dropout=cfg.attn_dropout,
                activation=cfg.activation,
                norm_first=True,
                norm_eps=cfg.norm_eps,
                attention=cfg.attention,
                window=cfg.window,
                n_global=cfg.n_global,
            )
            for _ in range(cfg.n_layers)
        ]
        self.encoder = Encoder(blocks, make_norm("layer", cfg.d_model, cfg.norm_eps))
        self.encoder.gradient_checkpointing = cfg.gradient_checkpointing
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)
        self.apply(_init_weights)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=0.02)

    def embed(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> z_0 (B, T, D): patch tokens, class token, positions  (eq. 1)."""
        c, s = self.cfg.in_channels, self.cfg.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (c, s, s):
            raise ValueError(
                f"images must have shape (B, {c}, {s}, {s}), got {tuple(images.shape)}; "
                "resize them to the model's image_size"
            )
        x = self.patch_embed(images)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1+N, D)
        return self.dropout(x + self.pos_embed)

    def pool(self, h: Tensor) -> Tensor:
        """(B, T, D) final-normed states -> (B, D): the class token or the mean of patches."""
        return h[:, 0] if self.cfg.pooling == "cls" else h.mean(dim=1)

    def forward(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> logits (B, n_classes)."""
        h = self.encoder(self.embed(images))  # (B, T, D)
        return self.head(self.pool(h))

    @torch.no_grad()
    def inspect(self, images: Tensor) -> dict[str, Tensor | list[Tensor]]:
        """Hidden states (embeddings + each block, before the final norm, as in Hugging Face),
        the final-normed output, attention (L, B, H, T, T) and logits."""
        x = self.embed(images)
        hidden, weights = [x], []
        for block in self.encoder.blocks:
            x, w = block(x, need_weights=True)
            hidden.append(x)
            weights.append(w)
        out = self.encoder.norm(x)  # (B, T, D)
        return {
            "hidden_states": hidden,
            "last_hidden_state": out,
            "attention": torch.stack(weights),
            "logits": self.head(self.pool(out)),
        }


def _init_weights(module: nn.Module) -> None:
    """Truncated-normal(0.02) linear/conv weights, zero biases, unit LayerNorm (as in timm)."""
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def attention_rollout(attention: Tensor, residual: float = 0.5) -> Tensor:
    """Rollout (Abnar & Zuidema 2020): Ã_l = r·I + (1−r)·mean_h A_l, rows renormalised;
    R = Ã_L ··· Ã_1. attention: (L, B, H, T, T) -> R (B, T, T)."""
    eye = torch.eye(attention.shape[-1], dtype=attention.dtype, device=attention.device)
    rollout = eye.expand(attention.shape[1], -1, -1)  # (B, T, T)
    for layer in attention:
        a = residual * eye + (1 - residual) * layer.mean(dim=1)  # (B, T, T)
        a = a / a.sum(dim=-1, keepdim=True)
        rollout = a @ rollout
    return rollout


def rollout_map(model: ViT, images: Tensor, residual: float = 0.5) -> Tensor:
    """How much each patch flows into the pooled output: (B, C, H, W) -> (B, G, G), rows sum 1."""
    rollout = attention_rollout(model.inspect(images)["attention"], residual)  # (B, T, T)
    # The class token's row (patches only), or the mean of every row for mean pooling: (B, N)
    cls = model.cfg.pooling == "cls"
    share = rollout[:, 0, 1:] if cls else rollout.mean(dim=1)
    share = share / share.sum(dim=-1, keepdim=True)
    g = model.cfg.grid
    return share.reshape(-1, g, g)


def n_params(model: nn.Module) -> int:
    """Number of parameters."""
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "PatchEmbedding",
    "ViT",
    "ViTConfig",
    "attention_rollout",
    "n_params",
    "rollout_map",
    "sincos_2d_table",
]
