"""ALBERT and DeBERTa with a masked-language-model head, for `attnlab train mlm --arch ...`, and
the classifier around an encoder of any BERT-shaped family.

The head is BERT's (dense -> activation -> LayerNorm -> tied word embeddings + bias); with
token embeddings narrower than the encoder (E < D, ALBERT's factorised embedding) its dense
layer maps D -> E, as ``AlbertMLMHead`` does, so the output layer can be the E-wide embedding.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.models.albert import AlbertConfig, AlbertModel
from attnlab.models.bert import (
    BertClassifier,
    BertConfig,
    BertForMaskedLM,
    BertMLMHead,
    init_bert_weights,
)
from attnlab.models.deberta import DebertaConfig, DebertaModel

ZooArch = Literal["albert", "deberta"]


class ZooForMaskedLM(nn.Module):
    """An ALBERT or DeBERTa encoder (``.bert``, the name BertForMaskedLM uses) + MLM head."""

    def __init__(self, arch: ZooArch, shape: BertConfig, embedding_size: int = 0) -> None:
        super().__init__()
        self.shape = shape  # the shape in BERT's terms (the run's ``[bert]`` section)
        fields = dict(
            vocab_size=shape.vocab_size,
            d_model=shape.d_model,
            n_layers=shape.n_layers,
            n_heads=shape.n_heads,
            d_ff=shape.d_ff,
            context=shape.context,
            dropout=shape.dropout,
            attn_dropout=shape.attn_dropout,
            pad_id=shape.pad_id,
            embedding_size=embedding_size,
        )
        if arch == "albert":
            self.bert: nn.Module = AlbertModel(AlbertConfig(**fields))
        else:
            self.bert = DebertaModel(DebertaConfig(**fields))  # v3 layout: log buckets
        width = self.bert.cfg.emb  # type: ignore[union-attr]
        self.mlm = BertMLMHead(replace(shape, d_model=width, n_heads=1))
        self.mlm.transform = nn.Linear(shape.d_model, width)  # D -> E
        init_bert_weights(self.mlm.transform)

    def forward(
        self, input_ids: Tensor, lengths: Tensor | None = None, where: Tensor | None = None
    ) -> Tensor:
        """ids (B, T), lengths (B,) -> logits (B, T, V), or (N, V) at ``where`` (B, T) only."""
        hidden = self.bert(input_ids, lengths)  # (B, T, D)
        if where is not None:
            hidden = hidden[where]  # (N, D)
        return self.mlm(hidden, self.bert.embeddings.word.weight)  # (..., V)


def encoder_classifier(
    shape: BertConfig, n_classes: int, pooling: str, family: str = "bert", embedding_size: int = 0
) -> BertClassifier:
    """A BertClassifier (pooled vector -> dropout -> linear) around an encoder of ``family``:
    BERT / XLM-R itself, or the ALBERT / DeBERTa encoder of a ``shape`` in BERT's terms."""
    model = BertClassifier(shape, n_classes, pooling)
    if family == "bert":
        return model
    if pooling == "cls" and family == "deberta":
        raise UserError("DeBERTa has no [CLS] pooler: use --pooling mean")
    model.bert = ZooForMaskedLM(family, shape, embedding_size).bert  # type: ignore[arg-type, assignment]
    return model


def masked_lm(arch: str, shape: BertConfig, embedding_size: int = 0) -> nn.Module:
    """A new masked LM of the registered architecture ``arch`` (bert, albert, deberta) whose
    encoder has ``shape`` in BERT's terms."""
    from attnlab.models.registry import model_entry

    family = model_entry(arch).family
    if family == "bert":
        if embedding_size:
            raise UserError("embedding_size is for --arch albert or deberta")
        return BertForMaskedLM(shape)
    if family not in ("albert", "deberta"):
        raise UserError(f"--arch {arch} has no masked-LM pretraining; use bert, albert or deberta")
    return ZooForMaskedLM(family, shape, embedding_size)  # type: ignore[arg-type]
