"""Vision Transformer (Dosovitskiy et al. 2021): patches -> tokens -> encoder -> class.

z_0 = [x_cls; x_p^1 E; ...; x_p^N E] + E_pos  (eq. 1), pre-norm encoder blocks (eqs. 2-3),
y = LN(z_L^0)  (eq. 4), then a linear head. The patch projection E is a convolution whose
kernel and stride are the patch size, which is the same as flattening each patch and
multiplying by E.

:class:`DeiT` (Touvron et al. 2021, §4) is the ViT plus a second learned token, the
distillation token, after the class token (both get positions); its final state feeds a second
head trained on a teacher's predictions. :meth:`DeiT.heads` returns both heads' logits;
``forward`` (inference) returns their mean, as DeiT and Hugging Face's
``DeiTForImageClassificationWithTeacher`` do. Its config is the ViT's with ``distill = true``
(what a run folder records); each class refuses the other's setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from attnlab.configs import ConfigBase, project, setting
from attnlab.errors import UserError
from attnlab.layers.attention import Backend
from attnlab.layers.blocks import (
    Activation,
    Block,
    BlockConfig,
    BlockStack,
    NormKind,
    block_setting,
)
from attnlab.layers.efficient import AttentionKind
from attnlab.layers.positions import make_positions, sincos_2d_table
from attnlab.models.registry import images, register_model


@dataclass
class ViTConfig(ConfigBase):
    """Shape of a ViT; ``n_classes`` and the image shape are filled in from the data."""

    image_size: int = setting(28, min=1)
    in_channels: int = setting(1, min=1)
    patch_size: int = setting(4, min=1)
    d_model: int = block_setting("d_model", 128)
    n_layers: int = setting(6, min=1)
    n_heads: int = block_setting("n_heads", 4)
    d_ff: int = block_setting("d_ff", 256)
    dropout: float = block_setting("dropout", 0.1)
    attn_dropout: float = block_setting("attn_dropout", 0.0)
    activation: Activation = block_setting("activation", "gelu")
    norm_eps: float = block_setting("norm_eps", 1e-6)
    norm: NormKind = block_setting("norm", "layer")
    dyt_alpha0: float = block_setting("dyt_alpha0")
    pooling: Literal["cls", "mean"] = setting("cls")
    distill: bool = setting(False, "the distillation token and head: true with --arch deit only")
    pos: Literal["learned", "sincos2d"] = setting("learned")
    stem: Literal["patch", "conv"] = setting("patch")
    attention: AttentionKind = block_setting("attention", "full")
    window: int = block_setting("window", 0)
    n_global: int = block_setting("n_global", 0)
    backend: Backend = block_setting("backend", "fused")
    stem_channels: int = setting(32, min=1)
    n_classes: int = setting(10, min=2)
    gradient_checkpointing: bool = setting(False)

    def check(self) -> None:
        if self.image_size % self.patch_size != 0:
            raise UserError(
                f"image_size={self.image_size} is not a multiple of patch_size="
                f"{self.patch_size}; choose a patch size that divides it"
            )
        if self.stem == "conv" and (self.patch_size & (self.patch_size - 1) or self.patch_size < 2):
            raise UserError(
                f"stem=conv halves the image per 3x3 stride-2 conv, so patch_size must be a power "
                f"of two >= 2, got {self.patch_size}; use stem=patch for other patch sizes"
            )
        if self.distill and self.pooling != "cls":
            raise UserError("distill=true (DeiT) needs pooling='cls': both tokens are read out")
        if self.pos == "sincos2d" and self.d_model % 4 != 0:
            raise UserError(f"pos=sincos2d needs d_model divisible by 4, got {self.d_model}")
        self.block_config()  # head counts, attention kernel

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def n_prefix(self) -> int:
        """Tokens before the patches: the class token (pooling cls), the distillation token."""
        return int(self.pooling == "cls") + int(self.distill)

    @property
    def n_tokens(self) -> int:
        """Sequence length: patches plus the class (and distillation) token."""
        return self.grid**2 + self.n_prefix

    def block_config(self) -> BlockConfig:
        """The pre-norm encoder block (eqs. 2-3)."""
        return project(self, BlockConfig, norm_position="pre")


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
        cfg.validate(complete=True)
        self.check_distill(cfg)
        self.cfg = cfg
        if cfg.stem == "conv":
            self.patch_embed: nn.Module = ConvStem(
                cfg.in_channels, cfg.patch_size, cfg.d_model, cfg.stem_channels
            )
        else:
            self.patch_embed = PatchEmbedding(cfg.in_channels, cfg.patch_size, cfg.d_model)
        cls = cfg.pooling == "cls"
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.d_model)) if cls else None
        self.add_tokens(cfg)
        self.pos_embed = make_positions(
            cfg.pos, cfg.d_model, cfg.n_heads, cfg.n_tokens, grid=cfg.grid, n_prefix=cfg.n_prefix
        ).absolute  # the class token's position is learned too, or zero with sincos2d
        self.dropout = nn.Dropout(cfg.dropout)
        block = cfg.block_config()
        self.encoder = BlockStack([Block(block) for _ in range(cfg.n_layers)], block.make_norm())
        self.encoder.gradient_checkpointing = cfg.gradient_checkpointing
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)
        self.add_heads(cfg)
        self.apply(init_vit_weights)
        for token in self.prefix():
            nn.init.normal_(token, std=0.02)

    def check_distill(self, cfg: ViTConfig) -> None:
        """A ViT has no distillation token: ``distill = true`` is :class:`DeiT`."""
        if cfg.distill:
            raise UserError("distill = true adds DeiT's distillation token: train --arch deit")

    def add_tokens(self, cfg: ViTConfig) -> None:
        """Learned tokens after the class token: none (DeiT: the distillation token)."""

    def add_heads(self, cfg: ViTConfig) -> None:
        """Heads after the class head: none (DeiT: the distillation head)."""

    def prefix(self) -> list[Tensor]:
        """The learned tokens before the patches, each (1, 1, D): the class token (pooling cls)."""
        return [] if self.cls_token is None else [self.cls_token]

    def embed(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> z_0 (B, T, D): patch tokens, class token, positions  (eq. 1)."""
        c, s = self.cfg.in_channels, self.cfg.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (c, s, s):
            raise ValueError(
                f"images must have shape (B, {c}, {s}, {s}), got {tuple(images.shape)}; "
                "resize them to the model's image_size"
            )
        x = self.patch_embed(images)  # (B, N, D)
        prefix = [t.expand(x.shape[0], -1, -1) for t in self.prefix()]
        x = torch.cat([*prefix, x], dim=1)  # (B, n_prefix + N, D)
        return self.dropout(self.pos_embed(x))  # (B, T, D)

    def pool(self, h: Tensor) -> Tensor:
        """(B, T, D) final-normed states -> (B, D): the class token or the mean of patches."""
        return h[:, 0] if self.cfg.pooling == "cls" else h.mean(dim=1)

    def classify(self, h: Tensor) -> Tensor:
        """Final-normed states (B, T, D) -> logits (B, n_classes)  (eq. 4 and the head)."""
        return self.head(self.pool(h))

    def forward(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> logits (B, n_classes)."""
        return self.classify(self.encoder(self.embed(images)))  # (B, n_classes)

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
            "logits": self.classify(out),
        }


class DeiT(ViT):
    """DeiT (Touvron et al. 2021, §4): the ViT with a distillation token after the class token
    and a second head on its final state, trained on a teacher's predictions (the vision task's
    step); at inference the prediction is the mean of both heads."""

    def check_distill(self, cfg: ViTConfig) -> None:
        """DeiT's config says ``distill = true`` (what a run folder records)."""
        if not cfg.distill:
            raise UserError("--arch deit trains a ViT with distill = true; do not turn it off")

    def add_tokens(self, cfg: ViTConfig) -> None:
        self.dist_token = nn.Parameter(torch.zeros(1, 1, cfg.d_model))

    def add_heads(self, cfg: ViTConfig) -> None:
        self.head_dist = nn.Linear(cfg.d_model, cfg.n_classes)

    def prefix(self) -> list[Tensor]:
        """The class token, then the distillation token, each (1, 1, D)."""
        return [*super().prefix(), self.dist_token]

    def heads(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """Final-normed states (B, T, D) -> class-head and distillation-head logits, each
        (B, n_classes): the class token's and the distillation token's states through their
        heads."""
        return self.head(self.pool(h)), self.head_dist(h[:, 1])

    @staticmethod
    def logits(cls_logits: Tensor, dist_logits: Tensor) -> Tensor:
        """The prediction: the mean of both heads' logits (B, n_classes)."""
        return (cls_logits + dist_logits) / 2

    def classify(self, h: Tensor) -> Tensor:
        return self.logits(*self.heads(h))


def init_vit_weights(module: nn.Module) -> None:
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
    cls, n = model.cfg.pooling == "cls", model.cfg.n_prefix
    share = rollout[:, 0, n:] if cls else rollout.mean(dim=1)
    share = share / share.sum(dim=-1, keepdim=True)
    g = model.cfg.grid
    return share.reshape(-1, g, g)


def n_params(model: nn.Module) -> int:
    """Number of parameters."""
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "DeiT",
    "PatchEmbedding",
    "ViT",
    "ViTConfig",
    "attention_rollout",
    "n_params",
    "rollout_map",
    "sincos_2d_table",
]


_TINY_VIT = {"image_size": 8, "patch_size": 4, "d_model": 16, "n_layers": 2, "n_heads": 2}
register_model(
    "vit", family="vit", config=ViTConfig, oracle="ViT (f32)", example=images, tiny=_TINY_VIT
)(ViT)
register_model(
    "deit",
    family="vit",
    config=ViTConfig,
    oracle="DeiT (distillation token)",
    example=images,
    defaults={"distill": True},
    tiny=_TINY_VIT,
)(DeiT)
