"""T5 (Raffel et al. 2020): one encoder-decoder frame for every text-to-text task.

What T5 changes relative to attnlab's core encoder-decoder (:mod:`attnlab.models.seq2seq`):

* **no absolute positions**: one learned scalar per (relative-distance bucket, head) is added
  to the self-attention scores (:class:`attnlab.layers.positions.T5RelativePositionBias`), computed
  once per stack and shared by every layer (:meth:`T5.encode`, :meth:`T5.decode`: ``bias=``);
  bidirectional buckets in the encoder, causal ones in the decoder; cross-attention has none;
* **pre-norm RMSNorm without bias** and no bias in any linear layer (:meth:`T5Config.block_config`);
* **unscaled dot products**: T5 computes q·k without 1/√d_k. attnlab's attention keeps its
  scale, so the query weights hold √d_k · W_q (a reparametrisation: the same function);
* the FFN is ReLU (v1.0) or the GELU-gated ``geglu_tanh`` (v1.1's "gated-gelu");
* one embedding shared by encoder, decoder and the output layer; v1.0 multiplies the decoder
  output by d_model^-0.5 before it (``scale_output``), v1.1 does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.configs import ConfigBase, setting
from attnlab.errors import UserError
from attnlab.layers.attention import KVCache, padding_mask, padding_mask_from_ids
from attnlab.layers.blocks import (
    Block,
    BlockConfig,
    BlockStack,
    Decoder,
    DecoderBlock,
    RMSNorm,
    block_setting,
)
from attnlab.layers.positions import T5RelativePositionBias, make_positions
from attnlab.models.registry import model_entry, register_model, token_pair


@dataclass
class T5Config(ConfigBase):
    """The architecture of a T5 model (HF names: d_kv = d_model / n_heads here)."""

    vocab_size: int = setting(32128, min=1)
    d_model: int = block_setting("d_model", 512)
    n_heads: int = block_setting("n_heads", 8)
    d_ff: int = block_setting("d_ff", 2048)
    n_layers: int = setting(6, "encoder layers", min=1)
    n_decoder_layers: int = setting(0, "0 = n_layers", min=0)
    num_buckets: int = setting(32, "relative-position buckets", min=2)
    max_distance: int = setting(128, "distance from which all offsets share a bucket", min=2)
    activation: Literal["relu", "geglu_tanh"] = setting(
        "relu", "relu (T5 v1.0) | geglu_tanh (v1.1 gated-gelu)"
    )
    scale_output: bool = setting(True, "decoder output × d_model^-0.5 before the tied head (v1.0)")
    norm_eps: float = block_setting("norm_eps", 1e-6)
    dropout: float = block_setting("dropout", 0.1)
    pad_id: int = 0

    def check(self) -> None:
        self.block_config()

    def block_config(self) -> BlockConfig:
        """T5's block: pre-norm RMSNorm, no biases, ReLU or gated-GELU feed-forward."""
        return BlockConfig(
            d_model=self.d_model,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            activation=self.activation,
            norm="rms",
            norm_position="pre",
            norm_eps=self.norm_eps,
            dropout=self.dropout,
            bias=False,
        )


class T5(nn.Module):
    """T5ForConditionalGeneration: shared embedding, encoder, decoder, tied output layer."""

    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        cfg.validate(complete=True)
        self.cfg = cfg
        block = cfg.block_config()
        n_dec = cfg.n_decoder_layers or cfg.n_layers
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.encoder = BlockStack(
            [Block(block) for _ in range(cfg.n_layers)], RMSNorm(cfg.d_model, cfg.norm_eps)
        )
        self.decoder = Decoder(
            [DecoderBlock(block) for _ in range(n_dec)], RMSNorm(cfg.d_model, cfg.norm_eps)
        )
        buckets = {"num_buckets": cfg.num_buckets, "max_distance": cfg.max_distance}
        self.encoder_bias = make_positions("t5", cfg.d_model, cfg.n_heads, 0, **buckets).bias
        self.decoder_bias = make_positions(
            "t5", cfg.d_model, cfg.n_heads, 0, causal=True, **buckets
        ).bias
        self.dropout = nn.Dropout(cfg.dropout)
        init_t5_weights(self)

    def encode(self, src: Tensor, src_lengths: Tensor | None = None) -> Tensor:
        """Source ids (B, S), right-padded to ``src_lengths`` (B,) -> memory (B, S, D)."""
        S = src.shape[1]
        mask = None if src_lengths is None else padding_mask(src_lengths, S)  # (B, 1, 1, S)
        x = self.dropout(self.shared(src))  # (B, S, D)
        x = self.encoder(x, mask, bias=self.encoder_bias(S, S))  # one bias for every layer
        return self.dropout(x)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_lengths: Tensor | None = None,
        tgt_lengths: Tensor | None = None,
    ) -> Tensor:
        """Target ids (B, T) over ``memory`` (B, S, D) -> decoder states (B, T, D)."""
        T, S = tgt.shape[1], memory.shape[1]
        self_mask = None if tgt_lengths is None else padding_mask(tgt_lengths, T)
        memory_mask = None if src_lengths is None else padding_mask(src_lengths, S)
        y = self.dropout(self.shared(tgt))  # (B, T, D)
        y = self.decoder(y, memory, self_mask, memory_mask, bias=self.decoder_bias(T, T))
        return self.dropout(y)  # (B, T, D)

    def logits(self, states: Tensor) -> Tensor:
        """Decoder states (B, T, D) -> vocabulary logits (B, T, V) through the shared embedding."""
        if self.cfg.scale_output:
            states = states * self.cfg.d_model**-0.5
        return F.linear(states, self.shared.weight)  # (B, T, V)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_lengths: Tensor | None = None,
        tgt_lengths: Tensor | None = None,
    ) -> Tensor:
        """Source (B, S) and target-input (B, T) ids -> logits (B, T, V)."""
        memory = self.encode(src, src_lengths)
        return self.logits(self.decode(tgt, memory, src_lengths, tgt_lengths))


class T5Translator(T5):
    """T5 behind the interface of :class:`attnlab.models.seq2seq.Seq2SeqTransformer`, so the
    translation task, its greedy/beam decoders (KV caches) and the explorer drive it unchanged:
    ``encode(src) -> (memory, src_mask)``, ``decode(tgt, memory, src_mask, offset=, caches=,
    cross_caches=) -> logits``, ``forward(src, tgt_in)``, ``new_caches()``. Padding is read
    from the ids (``pad_id``), as the translation batches are right-padded with it."""

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        """src ids (B, S) -> memory (B, S, D) and the source key mask (B, 1, 1, S)."""
        S = src.shape[1]
        src_mask = padding_mask_from_ids(src, self.cfg.pad_id)  # (B, 1, 1, S)
        x = self.dropout(self.shared(src))  # (B, S, D)
        x = self.encoder(x, src_mask, bias=self.encoder_bias(S, S))
        return self.dropout(x), src_mask  # type: ignore[arg-type]

    def decode(  # type: ignore[override]
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        *,
        offset: int = 0,
        caches: list[Any] | None = None,
        cross_caches: list[KVCache] | None = None,
    ) -> Tensor:
        """Target ids (B, T) at positions offset.. -> logits (B, T, V); with caches the
        relative bias covers the cached keys too (queries offset.., keys 0..offset+T-1)."""
        T = tgt.shape[1]
        self_mask = None
        if caches is None and bool((tgt == self.cfg.pad_id).any()):
            self_mask = padding_mask_from_ids(tgt, self.cfg.pad_id)  # (B, 1, 1, T)
        y = self.dropout(self.shared(tgt))  # (B, T, D)
        bias = self.decoder_bias(T, offset + T, offset)  # (1, H, T, offset + T)
        y = self.decoder(
            y, memory, self_mask, src_mask, bias=bias, caches=caches, cross_caches=cross_caches
        )
        return self.logits(self.dropout(y))  # type: ignore[arg-type]

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:  # type: ignore[override]
        """Teacher forcing: src (B, S), shifted target tgt_in (B, T) -> logits (B, T, V)."""
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_caches(self) -> tuple[list[Any], list[KVCache]]:
        """Empty self- and cross-attention caches, one per decoder layer."""
        blocks = self.decoder.blocks
        return [b.self_attn.new_cache() for b in blocks], [KVCache() for _ in blocks]


def t5_from_seq2seq(cfg: Any) -> T5Config:
    """The T5 of a translation run's model section (a ``Seq2SeqConfig``, ``--arch t5``):
    one shared vocabulary, its sizes and dropout; T5's own norm, positions and output scale."""
    return T5Config(
        vocab_size=cfg.src_vocab_size,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_ff=cfg.d_ff,
        n_layers=cfg.n_encoder_layers,
        n_decoder_layers=cfg.n_decoder_layers,
        activation=cfg.activation,
        dropout=cfg.dropout,
        pad_id=cfg.pad_id,
    )


@torch.no_grad()
def init_t5_weights(model: T5) -> None:
    """T5's initialisation (HF ``_init_weights``, factor 1) in attnlab's parametrisation: the
    query rows carry √d_k, so they are N(0, d_model^-1/2) like keys and values."""
    D, F_ = model.cfg.d_model, model.cfg.d_ff
    nn.init.normal_(model.shared.weight, std=1.0)
    for m in model.modules():
        if isinstance(m, RMSNorm):
            nn.init.ones_(m.weight)
        elif isinstance(m, T5RelativePositionBias):
            nn.init.normal_(m.embedding.weight, std=D**-0.5)
    for name, p in model.named_parameters():
        if name.endswith(("q_proj.weight", "kv_proj.weight", "out_proj.weight", "ff.w_in.weight")):
            nn.init.normal_(p, std=D**-0.5)
        elif name.endswith("ff.w_out.weight"):
            nn.init.normal_(p, std=F_**-0.5)


def _check_t5(m: Any) -> None:
    """What T5 fixes that the model section could set otherwise."""
    if not m.shared_embeddings:
        raise UserError("--arch t5 has one embedding for both sides: shared_embeddings")
    if m.activation not in ("relu", "geglu_tanh"):
        raise UserError("--arch t5 takes activation relu (v1.0) or geglu_tanh (v1.1)")
    if m.attention != "full":
        raise UserError("--arch t5 takes attention=full")


def check_translator(arch: str, cfg: Any) -> None:
    """Refuse what a translation run's model section (a ``Seq2SeqConfig``) sets that the
    architecture ``arch`` (seq2seq or t5) fixes otherwise."""
    if model_entry(arch).family == "t5":
        _check_t5(cfg)


def translator(arch: str, cfg: Any) -> nn.Module:
    """The translation model of ``arch`` from a run's ``Seq2SeqConfig``: attnlab's Transformer
    (seq2seq), or T5 behind its interface (t5)."""
    from attnlab.models.seq2seq import Seq2SeqTransformer

    if model_entry(arch).family == "t5":
        return T5Translator(t5_from_seq2seq(cfg))
    return Seq2SeqTransformer(cfg)


register_model(
    "t5",
    family="t5",
    config=T5Config,
    oracle="T5 v1.0/v1.1 + gradients",
    example=token_pair("vocab_size", "vocab_size"),
    tiny={"vocab_size": 40, "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1},
)(T5)
