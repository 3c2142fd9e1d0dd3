"""Masked autoencoder (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners").

What it changes relative to the core pieces: the encoder *is* attnlab's :class:`ViT` (patch
embedding, class token, fixed 2-D sin-cos positions, pre-norm blocks, final norm; its head is
unused here), so the pretrained encoder loads into a ViT classifier for fine-tuning unchanged.
Before the encoder, a random ``mask_ratio`` (75%) of each image's patch tokens is dropped by
per-sample shuffling (§3: argsort of uniform noise; the first 25% are kept), so the encoder only
sees the visible patches (plus the class token). The light decoder (§3) embeds the encoded
tokens to its own width, appends a shared learned mask token for every dropped patch, restores
the original order, adds its own fixed sin-cos positions, runs a few pre-norm blocks (again
:class:`Block`), and predicts each patch's p²·C pixel values. The loss is the mean
squared error on the masked patches only, optionally against per-patch normalised pixels
(``norm_pix_loss``, §3 "Reconstruction target").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.configs import ConfigBase, setting
from attnlab.errors import UserError
from attnlab.layers.blocks import (
    Activation,
    Block,
    BlockConfig,
    BlockStack,
    NormKind,
    block_setting,
)
from attnlab.layers.positions import make_positions
from attnlab.models.registry import images, register_model
from attnlab.models.vit import ViT, ViTConfig, init_vit_weights


@dataclass
class MAEConfig(ConfigBase):
    """Encoder (a ViT) and light decoder of a masked autoencoder."""

    image_size: int = setting(28, min=1)
    in_channels: int = setting(1, min=1)
    patch_size: int = setting(4, min=1)
    d_model: int = setting(96, "encoder width", min=4)
    n_layers: int = setting(4, "encoder blocks", min=1)
    n_heads: int = block_setting("n_heads", 4)
    d_ff: int = block_setting("d_ff", 192)
    decoder_d_model: int = setting(64, "decoder width (divisible by 4)", min=4)
    decoder_layers: int = setting(2, min=1)
    decoder_heads: int = setting(4, min=1)
    decoder_d_ff: int = setting(128, min=1)
    mask_ratio: float = setting(
        0.75, "share of patches hidden from the encoder", min=0.0, below=1.0
    )
    norm_pix_loss: bool = setting(True, "targets: each patch's pixels normalised (MAE §3)")
    activation: Activation = block_setting("activation", "gelu")
    norm: NormKind = block_setting("norm", "layer")
    norm_eps: float = block_setting("norm_eps", 1e-6)
    dyt_alpha0: float = block_setting("dyt_alpha0")
    n_classes: int = setting(10, "classes of the ViT that fine-tunes the encoder", min=2)

    def check(self) -> None:
        self.encoder_config()  # patch size, heads
        self.decoder_block()
        if self.decoder_d_model % 4:
            raise UserError(f"decoder_d_model={self.decoder_d_model} must be divisible by 4")

    def encoder_config(self) -> ViTConfig:
        """The ViT the encoder is (and that fine-tuning builds): patch stem, sin-cos positions."""
        cfg = ViTConfig(
            image_size=self.image_size,
            in_channels=self.in_channels,
            patch_size=self.patch_size,
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            dropout=0.0,
            activation=self.activation,
            norm=self.norm,
            norm_eps=self.norm_eps,
            dyt_alpha0=self.dyt_alpha0,
            pooling="cls",
            pos="sincos2d",
            stem="patch",
            n_classes=self.n_classes,
        )
        cfg.validate()
        return cfg

    def decoder_block(self) -> BlockConfig:
        block = BlockConfig(
            d_model=self.decoder_d_model,
            n_heads=self.decoder_heads,
            d_ff=self.decoder_d_ff,
            activation=self.activation,
            norm=self.norm,
            norm_position="pre",
            norm_eps=self.norm_eps,
            dyt_alpha0=self.dyt_alpha0,
            dropout=0.0,
        )
        block.validate()
        return block


def patchify(images: Tensor, p: int) -> Tensor:
    """(B, C, H, W) -> (B, N, p·p·C), patches row-major, pixels (row, column, channel)."""
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(B, (H // p) * (W // p), p * p * C)


def unpatchify(patches: Tensor, p: int, channels: int) -> Tensor:
    """(B, N, p·p·C) -> (B, C, H, W): the inverse of :func:`patchify` for a square grid."""
    B, N, _ = patches.shape
    g = int(round(N**0.5))
    x = patches.reshape(B, g, g, p, p, channels).permute(0, 5, 1, 3, 2, 4)
    return x.reshape(B, channels, g * p, g * p)


def random_masking(
    n_tokens: int, mask_ratio: float, noise: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample shuffle by argsort of ``noise`` (B, N): the indices kept (B, N_keep), the mask
    (B, N; 1 = dropped) and the order that restores the shuffled sequence (B, N)."""
    n_keep = int(n_tokens * (1 - mask_ratio))
    ids_shuffle = torch.argsort(noise, dim=1)  # (B, N): ascending noise first
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    mask = torch.ones_like(noise)
    mask[:, :n_keep] = 0
    return ids_shuffle[:, :n_keep], torch.gather(mask, 1, ids_restore), ids_restore


class MAE(nn.Module):
    """Masked autoencoder: images (B, C, H, W) -> loss, per-patch predictions, mask."""

    def __init__(self, cfg: MAEConfig) -> None:
        super().__init__()
        cfg.validate(complete=True)
        self.cfg = cfg
        self.encoder = ViT(cfg.encoder_config())
        Dd, grid = cfg.decoder_d_model, cfg.image_size // cfg.patch_size
        self.decoder_embed = nn.Linear(cfg.d_model, Dd)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, Dd))
        self.decoder_pos = make_positions("sincos2d", Dd, 1, 0, grid=grid, n_prefix=1).absolute
        block = cfg.decoder_block()
        self.decoder = BlockStack(
            [Block(block) for _ in range(cfg.decoder_layers)], block.make_norm()
        )
        self.decoder_pred = nn.Linear(Dd, cfg.patch_size**2 * cfg.in_channels)
        for module in (self.decoder_embed, self.decoder, self.decoder_pred):
            module.apply(init_vit_weights)
        nn.init.normal_(self.mask_token, std=0.02)

    def encode(self, images: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Visible patches through the encoder: states (B, 1 + N_keep, D) (final-normed), mask
        (B, N) and restore order (B, N)."""
        x = self.encoder.embed(images)  # (B, 1 + N, D): class token, patches, positions
        cls, patches = x[:, :1], x[:, 1:]
        keep, mask, restore = random_masking(patches.shape[1], self.cfg.mask_ratio, noise)
        visible = torch.gather(patches, 1, keep[..., None].expand(-1, -1, x.shape[-1]))
        return self.encoder.encoder(torch.cat([cls, visible], dim=1)), mask, restore

    def decode(self, latent: Tensor, restore: Tensor) -> Tensor:
        """(B, 1 + N_keep, D) -> per-patch pixel predictions (B, N, p·p·C)."""
        x = self.decoder_embed(latent)  # (B, 1 + N_keep, Dd)
        B, N = restore.shape
        masks = self.mask_token.expand(B, N + 1 - x.shape[1], -1)  # (B, N - N_keep, Dd)
        tokens = torch.cat([x[:, 1:], masks], dim=1)  # (B, N, Dd), shuffled order
        tokens = torch.gather(tokens, 1, restore[..., None].expand(-1, -1, x.shape[-1]))
        x = self.decoder_pos(torch.cat([x[:, :1], tokens], dim=1))  # (B, 1 + N, Dd)
        return self.decoder_pred(self.decoder(x))[:, 1:]  # (B, N, p·p·C)

    def loss(self, images: Tensor, pred: Tensor, mask: Tensor) -> Tensor:
        """Mean over masked patches of the mean squared pixel error (MAE §3)."""
        target = patchify(images, self.cfg.patch_size)  # (B, N, p·p·C)
        if self.cfg.norm_pix_loss:
            mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
            target = (target - mean) / (var + 1e-6) ** 0.5
        per_patch = (pred - target).pow(2).mean(dim=-1)  # (B, N)
        return (per_patch * mask).sum() / mask.sum()

    def forward(self, images: Tensor, noise: Tensor | None = None) -> dict[str, Tensor]:
        """``noise`` (B, N) chooses the kept patches (lowest noise); uniform when None."""
        n = (self.cfg.image_size // self.cfg.patch_size) ** 2
        if noise is None:
            noise = torch.rand(images.shape[0], n, device=images.device)
        latent, mask, restore = self.encode(images, noise)
        pred = self.decode(latent, restore)
        return {"loss": self.loss(images, pred, mask), "pred": pred, "mask": mask, "latent": latent}

    @torch.no_grad()
    def reconstruct(self, images: Tensor, noise: Tensor | None = None) -> dict[str, Tensor]:
        """The masked input, the reconstruction (visible patches pasted back) and the raw
        prediction, as images (B, C, H, W) in the input's scale (per-patch statistics restored
        when the targets were normalised)."""
        out = self.forward(images, noise)
        p, c = self.cfg.patch_size, self.cfg.in_channels
        target = patchify(images, p)
        pred = out["pred"]
        if self.cfg.norm_pix_loss:
            mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
            pred = pred * (var + 1e-6) ** 0.5 + mean
        m = out["mask"][..., None]  # (B, N, 1)
        return {
            "masked": unpatchify(target * (1 - m), p, c),
            "reconstruction": unpatchify(target * (1 - m) + pred * m, p, c),
            "prediction": unpatchify(pred, p, c),
            "mask": out["mask"],
        }


def _masked_images(cfg: MAEConfig, batch: int) -> tuple[Tensor, Tensor]:
    """Images (B, C, H, W) and the noise (B, N) that picks the kept patches."""
    n = (cfg.image_size // cfg.patch_size) ** 2
    return images(cfg, batch)[0], torch.rand(batch, n)


register_model(
    "mae",
    family="mae",
    config=MAEConfig,
    oracle="MAE encoder + decoder, loss, gradients",
    example=_masked_images,
    tiny={
        "image_size": 8,
        "patch_size": 4,
        "d_model": 16,
        "n_layers": 1,
        "n_heads": 2,
        "d_ff": 32,
        "decoder_d_model": 8,
        "decoder_layers": 1,
        "decoder_heads": 2,
        "decoder_d_ff": 16,
    },
)(MAE)
