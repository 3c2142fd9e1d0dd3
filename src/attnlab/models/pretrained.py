"""A pretrained encoder together with what reads text for it.

Every verb that uses pretrained weights — fine-tuning a classifier, masked-LM pretraining from a
checkpoint, embed, similarity, search, explore — receives a :class:`Pretrained`: the encoder,
the tokenizer that reads texts for it (with the input prefix its model card asks for, such as
multilingual-e5's ``"query: "``), how many pieces it reads at most, and where its weights and
tokenizer come from. A registry entry with ``load`` returns one
(``models.registry.load_pretrained("e5")``); ``runs.encoders.open_encoder`` is the one door
that also opens checkpoint folders and attnlab pretraining runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from attnlab.errors import UserError

Family = str  # the encoder family a classifier wraps: "bert" (BERT, XLM-R), "albert", "deberta"


@dataclass
class Pretrained:
    """A pretrained encoder, its tokenizer and its provenance.

    ``model`` maps ids (B, T) right-padded to lengths (B,) to hidden states (B, T, D) and has
    ``cfg`` (its BERT-shaped config). ``tokenizer`` reads texts for the default role; an encoder
    trained with input prefixes (``prefixes``: role -> text) gives the others through
    :meth:`tokenizer_for`."""

    name: str  # a registry name, or the folder's path
    model: nn.Module
    tokenizer: Any  # a PieceTokenizer (WordPiece or SentencePiece)
    max_len: int  # pieces it reads at most, specials included
    source: Mapping[str, str]  # model, weights, tokenizer: where each comes from, with licences
    family: Family = "bert"
    embedding_size: int = 0  # ALBERT/DeBERTa token embedding width (0 = d_model)
    prefixes: Mapping[str, str] = field(default_factory=dict)  # role -> prefix; {}: none
    role: str = ""  # the role ``tokenizer`` reads for ("" when there are no prefixes)
    notes: list[str] = field(default_factory=list)  # what loading left at initial values
    fresh: tuple[str, ...] = ()  # state-dict names the weights did not provide (initial values)
    mlm: nn.Module | None = None  # the masked-LM head, when the checkpoint has one
    shape: Any = None  # the encoder in BERT's terms (a BertConfig) when ``model.cfg`` is not one
    _reader: Callable[[str], Any] | None = None  # prefix -> a tokenizer that writes it first

    @property
    def bert_shape(self) -> Any:
        """The encoder's architecture in BERT's terms (a BertConfig): what a classifier of its
        family is built from."""
        return self.shape if self.shape is not None else self.model.cfg

    def tokenizer_for(self, role: str) -> Any:
        """The tokenizer that reads texts of ``role`` (query, passage, ...)."""
        if not self.prefixes:
            return self.tokenizer  # this encoder reads every text as it is
        if role not in self.prefixes:
            raise UserError(
                f"{self.name} reads texts as one of {', '.join(sorted(self.prefixes))}, "
                f"not {role!r}"
            )
        if role == self.role:
            return self.tokenizer
        assert self._reader is not None, "an encoder with prefixes needs a reader"
        return self._reader(self.prefixes[role])
