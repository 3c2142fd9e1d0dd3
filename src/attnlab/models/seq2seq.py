"""The encoder-decoder Transformer of Vaswani et al. (2017) for translation, from the core blocks.

Source and target ids (B, S) and (B, T) are embedded and scaled by √d_model (§3.4), given
sinusoidal positions (§3.5), encoded and decoded by the Encoder/Decoder stacks (each with a
final norm, as ``nn.Transformer``), and projected to target-vocabulary logits through the
target embedding matrix (``tie_weights``). Padding is masked on both sides; the decoder is
also causal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnlab.configs import ConfigBase, project, setting
from attnlab.errors import UserError
from attnlab.layers.attention import Backend, KVCache, padding_mask_from_ids
from attnlab.layers.blocks import (
    Activation,
    Block,
    BlockConfig,
    BlockStack,
    Decoder,
    DecoderBlock,
    NormKind,
    NormPosition,
    block_setting,
)
from attnlab.layers.efficient import AttentionKind
from attnlab.layers.positions import make_positions
from attnlab.models.registry import register_model, token_pair


@dataclass
class Seq2SeqConfig(ConfigBase):
    """Shape of the encoder-decoder model; vocabulary sizes are filled in from the tokenizer."""

    src_vocab_size: int = setting(0, min=1, unset=0, set_by="the source tokenizer")
    tgt_vocab_size: int = setting(0, min=1, unset=0, set_by="the target tokenizer")
    shared_embeddings: bool = setting(True)
    d_model: int = block_setting("d_model", 256)
    n_heads: int = block_setting("n_heads", 4)
    n_encoder_layers: int = setting(3, min=1)
    n_decoder_layers: int = setting(3, min=1)
    d_ff: int = block_setting("d_ff", 1024)
    dropout: float = block_setting("dropout", 0.1)
    activation: Activation = block_setting("activation", "relu")
    norm: NormKind = block_setting("norm", "layer")
    dyt_alpha0: float = block_setting("dyt_alpha0")
    norm_position: NormPosition = block_setting("norm_position", "post")
    pos: Literal["sinusoidal", "learned"] = setting("sinusoidal")
    context: int = setting(512, "longest source or target (learned positions)", min=1)
    tie_weights: bool = setting(True, "output projection = target embedding")
    pad_id: int = setting(0)
    gradient_checkpointing: bool = setting(
        False, "recompute block activations in backward (less memory)"
    )
    attention: AttentionKind = block_setting("attention", "full")
    window: int = block_setting("window", 0)
    n_global: int = block_setting("n_global", 0)
    backend: Backend = block_setting("backend", "fused")

    def check(self) -> None:
        if self.shared_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise UserError(
                "shared_embeddings needs one vocabulary for both sides, got sizes "
                f"{self.src_vocab_size} and {self.tgt_vocab_size}; set shared_embeddings=false"
            )
        self.block_config()  # head counts, attention kernel

    def block_config(self) -> BlockConfig:
        """The block of both stacks (the decoder adds cross-attention; it is always full)."""
        return project(self, BlockConfig)


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer: logits = Decoder(Embed(y), Encoder(Embed(x))) Eᵀ."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        cfg.validate(complete=True)
        self.cfg = cfg
        d = cfg.d_model
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d, padding_idx=cfg.pad_id)
        self.tgt_embed = (
            self.src_embed
            if cfg.shared_embeddings
            else nn.Embedding(cfg.tgt_vocab_size, d, padding_idx=cfg.pad_id)
        )
        for emb in {id(m): m for m in (self.src_embed, self.tgt_embed)}.values():
            nn.init.normal_(emb.weight, std=d**-0.5)  # unit variance after the √d scaling
            with torch.no_grad():
                emb.weight[cfg.pad_id].zero_()
        self.pos = make_positions(cfg.pos, d, cfg.n_heads, cfg.context).absolute
        self.dropout = nn.Dropout(cfg.dropout)
        block = cfg.block_config()
        self.encoder = BlockStack(
            [Block(block) for _ in range(cfg.n_encoder_layers)], block.make_norm()
        )
        self.decoder = Decoder(
            [DecoderBlock(block) for _ in range(cfg.n_decoder_layers)], block.make_norm()
        )
        self.encoder.gradient_checkpointing = cfg.gradient_checkpointing
        self.decoder.gradient_checkpointing = cfg.gradient_checkpointing
        self.out_proj = nn.Linear(d, cfg.tgt_vocab_size, bias=False)
        if cfg.tie_weights:
            self.out_proj.weight = self.tgt_embed.weight

    def num_params(self) -> int:
        """Distinct parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters())

    def _embed(self, emb: nn.Embedding, ids: Tensor, offset: int = 0) -> Tensor:
        """x = Dropout(E[ids] · √d_model + PE[offset:])  (§3.4, §3.5): (B, T) -> (B, T, D)."""
        return self.dropout(self.pos(emb(ids) * math.sqrt(self.cfg.d_model), offset))

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src ids (B, S) -> memory (B, S, D) and the source key mask (B, 1, 1, S)."""
        src_mask = padding_mask_from_ids(src, self.cfg.pad_id)  # (B, 1, 1, S)
        memory = self.encoder(self._embed(self.src_embed, src), src_mask)  # (B, S, D)
        return memory, src_mask  # type: ignore[return-value]

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        *,
        offset: int = 0,
        caches: list[Any] | None = None,
        cross_caches: list[KVCache] | None = None,
    ) -> Tensor:
        """Target ids (B, T) at positions offset.. -> logits (B, T, V_tgt).

        Without caches the target's own padding is masked (keys) on top of the causal mask;
        padded query rows (right padding) still see the BOS and real tokens before them, so no
        row is empty; their outputs are ignored by the loss.
        """
        self_mask = None
        if caches is None and bool((tgt == self.cfg.pad_id).any()):
            self_mask = padding_mask_from_ids(tgt, self.cfg.pad_id)  # (B, 1, 1, T)
        h = self.decoder(
            self._embed(self.tgt_embed, tgt, offset),
            memory,
            self_mask,
            src_mask,
            is_causal=True,
            caches=caches,
            cross_caches=cross_caches,
        )  # (B, T, D)
        return self.out_proj(h)  # (B, T, V)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: src (B, S), shifted target tgt_in (B, T) -> logits (B, T, V)."""
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask)

    def new_caches(self) -> tuple[list[Any], list[KVCache]]:
        """Empty self-attention caches (each kernel's own kind: KVCache, sliding window or
        linear state) and cross-attention caches, one per decoder layer."""
        blocks = self.decoder.blocks
        return [b.self_attn.new_cache() for b in blocks], [KVCache() for _ in blocks]


register_model(
    "seq2seq",
    family="seq2seq",
    config=Seq2SeqConfig,
    oracle="BlockStack + Decoder",
    example=token_pair("src_vocab_size", "tgt_vocab_size"),
    defaults={"src_vocab_size": 8000, "tgt_vocab_size": 8000},
    tiny={
        "src_vocab_size": 40,
        "tgt_vocab_size": 40,
        "d_model": 16,
        "n_heads": 2,
        "n_encoder_layers": 1,
        "n_decoder_layers": 1,
        "d_ff": 32,
        "context": 16,
    },
)(Seq2SeqTransformer)
