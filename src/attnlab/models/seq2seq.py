"""The encoder-decoder Transformer of Vaswani et al. (2017) for translation, from the core blocks.

Source and target ids (B, S) and (B, T) are embedded and scaled by √d_model (§3.4), given
sinusoidal positions (§3.5), encoded and decoded by the Encoder/Decoder stacks (each with a
final norm, as ``nn.Transformer``), and projected to target-vocabulary logits through the
target embedding matrix (tied). Padding is masked on both sides; the decoder is also causal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnlab.attention import KVCache, padding_mask_from_ids
from attnlab.blocks import Decoder, DecoderBlock, Encoder, EncoderBlock, make_norm
from attnlab.efficient import check_attention_config
from attnlab.positions import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


@dataclass
class Seq2SeqConfig:
    """Shape of the encoder-decoder model; vocabulary sizes are filled in from the tokenizer."""

    src_vocab_size: int = 0
    tgt_vocab_size: int = 0
    shared_embeddings: bool = True
    d_model: int = 256
    n_heads: int = 4
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    activation: Literal["relu", "gelu"] = "relu"
    norm_first: bool = False
    pos: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_len: int = 512
    tie_output: bool = True
    pad_id: int = 0
    gradient_checkpointing: bool = False  # recompute block activations in backward (less memory)
    attention: str = "full"  # self-attention: full | local (sliding window) | linear (elu+1)
    window: int = 0  # attention="local": keys within this distance, itself included
    n_global: int = 0  # attention="local": leading tokens that see and are seen by all

    def validate(self) -> None:
        """Raise ValueError naming the field to change."""
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("n_encoder_layers", "n_decoder_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.shared_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "shared_embeddings needs one vocabulary for both sides, got sizes "
                f"{self.src_vocab_size} and {self.tgt_vocab_size}; set shared_embeddings=false"
            )
        if self.pos not in ("sinusoidal", "learned"):
            raise ValueError(f"pos must be sinusoidal or learned, got {self.pos!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        check_attention_config(self.attention, self.window, self.n_global)


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer: logits = Decoder(Embed(y), Encoder(Embed(x))) Eᵀ."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        cfg.validate()
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
        self.pos: nn.Module = (
            SinusoidalPositionalEncoding(d, cfg.max_len)
            if cfg.pos == "sinusoidal"
            else LearnedPositionalEmbedding(cfg.max_len, d)
        )
        self.dropout = nn.Dropout(cfg.dropout)
        kw = dict(
            dropout=cfg.dropout,
            activation=cfg.activation,
            norm_first=cfg.norm_first,
            attention=cfg.attention,
            window=cfg.window,
            n_global=cfg.n_global,
        )
        self.encoder = Encoder(
            [EncoderBlock(d, cfg.n_heads, cfg.d_ff, **kw) for _ in range(cfg.n_encoder_layers)],
            make_norm("layer", d),
        )
        self.decoder = Decoder(
            [DecoderBlock(d, cfg.n_heads, cfg.d_ff, **kw) for _ in range(cfg.n_decoder_layers)],
            make_norm("layer", d),
        )
        self.encoder.gradient_checkpointing = cfg.gradient_checkpointing
        self.decoder.gradient_checkpointing = cfg.gradient_checkpointing
        self.out_proj = nn.Linear(d, cfg.tgt_vocab_size, bias=False)
        if cfg.tie_output:
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
