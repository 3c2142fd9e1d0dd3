"""How a classifier reads text: a tokenizer and how much of a text it keeps.

A reader turns texts into the id sequences the model reads (specials included, truncated to
``max_len`` ids), says which texts it had to cut, names the tokens, and measures how much of a
text reached the model as unknown (:func:`attnlab.data.coverage.reach`). The character model
reads characters (:class:`CharReader`); a pretrained encoder reads its own pieces
(:class:`PieceReader`: WordPiece or SentencePiece). Training data, ``predict``, ``eval``, the
attention heatmaps and the explorer all read through the run's reader, so a text is read the
same way everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnlab.data.buckets import LengthBucketSampler
from attnlab.data.char_tokenizer import CLS_ID, UNK_ID, CharTokenizer
from attnlab.data.classification import ClassificationData
from attnlab.data.coverage import reach


class CharReader:
    """Characters, with an optional leading ``<cls>``; a long text keeps its head (and, with
    ``tail_share``, that share of its room from its end)."""

    unit = "characters"

    def __init__(
        self, tokenizer: CharTokenizer, max_len: int, add_cls: bool, tail_share: float = 0.0
    ) -> None:
        self.tokenizer, self.max_len = tokenizer, max_len
        self.add_cls, self.tail_share = add_cls, tail_share
        self.pad_id = 0

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """The ids of each text, truncated to ``max_len``."""
        encode = self.tokenizer.encode
        return [encode(t, self.max_len, self.add_cls, self.tail_share) for t in texts]

    def lengths(self, texts: Sequence[str]) -> list[int]:
        """Untruncated lengths in ids."""
        return [len(t) + int(self.add_cls) for t in texts]

    def tokens(self, text: str) -> list[str]:
        """The tokens the model reads for ``text``, as strings."""
        return self.tokenizer.tokens(text, self.max_len, self.add_cls, self.tail_share)

    def reach(self, ids: Sequence[int]) -> dict[str, Any]:
        return reach(ids, UNK_ID, {CLS_ID}, unit=self.unit)


class PieceReader:
    """A pretrained encoder's tokenizer (WordPiece or SentencePiece): ``<s> pieces </s>`` (or
    ``[CLS] … [SEP]``), a long text keeping its head."""

    unit = "word pieces"

    def __init__(self, tokenizer: Any, max_len: int) -> None:
        self.tokenizer, self.max_len = tokenizer, max_len
        self.pad_id = tokenizer.pad_id

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.tokenizer.encode_batch(list(texts), self.max_len)

    def lengths(self, texts: Sequence[str]) -> list[int]:
        return self.tokenizer.lengths(list(texts))

    def tokens(self, text: str) -> list[str]:
        return self.tokenizer.tokens(text, self.max_len)

    def reach(self, ids: Sequence[int]) -> dict[str, Any]:
        tok = self.tokenizer
        return reach(ids, tok.unk_id, {tok.cls_id, tok.sep_id}, unit=self.unit)


Reader = CharReader | PieceReader

# padded tokens a row of an evaluation batch may take on average: training's longest texts (128)
EVAL_ROW_TOKENS = 128


def dataset(
    reader: Reader,
    texts: Sequence[str],
    labels: Sequence[int],
    batch_size: int,
    shuffle: bool = False,
    seed: int = 0,
) -> ClassificationData:
    """``texts`` read by ``reader`` with integer ``labels``, length-bucketed into batches of
    ``batch_size``. Evaluation data (``shuffle`` false) also caps a batch's padded tokens at
    ``batch_size`` rows of :data:`EVAL_ROW_TOKENS`: a batch of the longest texts a reader keeps
    (e5's 512 pieces) then holds fewer rows, not four times the activations of any other."""
    seqs = reader.encode_batch(texts)
    lengths = [len(s) for s in seqs]
    budget = None if shuffle else max(batch_size * EVAL_ROW_TOKENS, max(lengths, default=1))
    sampler = LengthBucketSampler(lengths, batch_size, shuffle=shuffle, seed=seed,
                                  max_tokens=budget)  # fmt: skip
    return ClassificationData(seqs, list(labels), sampler, pad_id=reader.pad_id)
