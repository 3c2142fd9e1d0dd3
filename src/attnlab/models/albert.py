"""ALBERT (Lan et al. 2020): a BERT with far fewer parameters.

What it changes relative to attnlab's BERT (:mod:`attnlab.models.bert`):

* **factorised embedding** (§3.1): tokens are embedded in E ≪ D dimensions and projected to D,
  V·E + E·D parameters instead of V·D (``AlbertModel.project``);
* **cross-layer sharing** (§3.1): one post-norm :class:`attnlab.layers.blocks.Block` is applied
  ``n_layers`` times (``AlbertModel.forward``'s loop), so depth adds compute, not parameters.

The block, the embeddings (word + position + type, LayerNorm) and the [CLS] pooler are BERT's.
(ALBERT's sentence-order-prediction pretraining head is not built here.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.layers.attention import padding_mask
from attnlab.layers.blocks import Block
from attnlab.models.bert import BertEmbeddings, init_bert_weights
from attnlab.models.electra import ElectraConfig, embedding_config
from attnlab.models.registry import register_model, tokens


@dataclass
class AlbertConfig(ElectraConfig):
    """BERT's fields plus ``embedding_size`` (ALBERT-base: E = 128, D = 768, 12 layers, one
    set of layer weights). ``activation`` is gelu_tanh in ALBERT's checkpoints."""


class AlbertModel(nn.Module):
    """Embeddings (width E) -> Linear E -> D -> one shared block × n_layers; the pooler."""

    def __init__(self, cfg: AlbertConfig) -> None:
        super().__init__()
        cfg.validate(complete=True)
        self.cfg = cfg
        self.embeddings = BertEmbeddings(embedding_config(cfg, cfg.emb))
        self.project = nn.Linear(cfg.emb, cfg.d_model)
        self.layer = Block(cfg.block_config())  # the one block every depth reuses
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model)
        init_bert_weights(self)

    def forward(
        self, input_ids: Tensor, lengths: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """ids (B, T) right-padded to ``lengths`` (B,) -> hidden (B, T, D)."""
        mask = None if lengths is None else padding_mask(lengths, input_ids.shape[1])
        x = self.project(self.embeddings(input_ids, token_type_ids))  # (B, T, D)
        for _ in range(self.cfg.n_layers):
            x, _ = self.layer(x, mask)  # the same weights at every depth
        return x

    def pool(self, hidden: Tensor) -> Tensor:
        """tanh(W h_[CLS] + b): (B, T, D) -> (B, D)."""
        return torch.tanh(self.pooler(hidden[:, 0]))


register_model(
    "albert",
    family="albert",
    config=AlbertConfig,
    oracle="ALBERT + gradients",
    example=tokens(lengths=True),
    defaults={"embedding_size": 128},  # ALBERT-base's factorised embedding
    tiny={
        "vocab_size": 40,
        "d_model": 16,
        "n_layers": 2,
        "n_heads": 2,
        "d_ff": 32,
        "context": 16,
        "embedding_size": 8,
    },
)(AlbertModel)
