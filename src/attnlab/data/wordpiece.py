"""WordPiece tokenisation for BERT, on the Hugging Face ``tokenizers`` library.

A :class:`WordPieceTokenizer` comes from a checkpoint's ``tokenizer.json`` or ``vocab.txt``
(lower-casing read from ``tokenizer_config.json``), or is trained on texts. Every encoding is
``[CLS] pieces [SEP]``, truncated to ``max_len`` ids (specials included), never padded:
attnlab pads batches itself (right padding, with lengths).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
from tokenizers.models import WordPiece

from attnlab.data.errors import DataError
from attnlab.data.io import read_json, read_utf8
from attnlab.errors import UserError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIALS = (PAD, UNK, CLS, SEP, MASK)


def continuation_pieces(tok: Tokenizer, texts: Sequence[str]) -> list[str]:
    """``##c`` for every character ``c`` that follows another inside a word, sorted.

    The trainer creates these pieces while iterating over a hash map, so their ids, which
    break ties between merges of equal count, differ from one process to the next, and so
    does the vocabulary (tokenizers issue #1794). Given first, in sorted order, as special
    tokens, they get the same ids every time and training is deterministic."""
    pieces: set[str] = set()
    for text in texts:
        normal = tok.normalizer.normalize_str(text) if tok.normalizer else text
        for word, _ in tok.pre_tokenizer.pre_tokenize_str(normal):
            pieces.update(word[1:])
    return [f"##{c}" for c in sorted(pieces)]


def _drop_added(tok: Tokenizer, names: set[str]) -> Tokenizer:
    """The tokenizer with ``names`` kept as vocabulary pieces but no longer added tokens (an
    added token would be matched whole in raw text, before WordPiece)."""
    state = json.loads(tok.to_str())
    state["added_tokens"] = [t for t in state["added_tokens"] if t["content"] not in names]
    return Tokenizer.from_str(json.dumps(state))


class PieceTokenizer:
    """What every subword tokenizer on the ``tokenizers`` library offers attnlab's models:
    specials around the pieces, truncation to ``max_len`` ids, never padding (attnlab pads
    batches itself). Subclasses set ``_tok`` and the special ids."""

    _tok: Tokenizer
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int

    def save(self, path: str | Path) -> None:
        """Write ``tokenizer.json`` (readable by ``tokenizers`` and ``transformers``)."""
        self._tok.save(str(path))

    # -- use

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def cjk_share(self) -> float:
        """Share of the vocabulary's pieces that are one CJK ideograph (a Chinese BERT's
        vocabulary is mostly such characters; an English one, or XLM-R's, holds few)."""
        vocab = self._tok.get_vocab()
        return sum(len(p) == 1 and _is_cjk(p) for p in vocab) / max(len(vocab), 1)

    @property
    def special_ids(self) -> tuple[int, ...]:
        return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)

    def encode(self, text: str, max_len: int) -> list[int]:
        """The text's ids between the start and end specials, truncated to ``max_len`` ids."""
        return self.encode_batch([text], max_len)[0]

    def encode_batch(self, texts: Sequence[str], max_len: int) -> list[list[int]]:
        """``encode`` for many texts at once (parallel in the library)."""
        if max_len < 3:
            raise UserError(
                f"max_len must be >= 3 (a start special + a piece + an end special), got {max_len}"
            )
        self._tok.enable_truncation(max_length=max_len)
        try:
            return [e.ids for e in self._tok.encode_batch(list(texts))]
        finally:
            self._tok.no_truncation()

    def tokens(self, text: str, max_len: int) -> list[str]:
        """The pieces ``encode`` produces, as strings."""
        return [self._tok.id_to_token(i) for i in self.encode(text, max_len)]

    def lengths(self, texts: Sequence[str]) -> list[int]:
        """Untruncated encoded lengths (specials included), to choose a truncation length."""
        return [len(e.ids) for e in self._tok.encode_batch(list(texts))]


class WordPieceTokenizer(PieceTokenizer):
    """BERT's tokenizer: normalise, split on whitespace/punctuation, WordPiece, add specials."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        missing = [t for t in SPECIALS if tokenizer.token_to_id(t) is None]
        if missing:
            raise UserError(f"the tokenizer's vocabulary lacks the BERT special tokens {missing}")
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tok = tokenizer
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            tokenizer.token_to_id(t) for t in SPECIALS
        )
        self._tok.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}",
            pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[(CLS, self.cls_id), (SEP, self.sep_id)],
        )

    # -- construction

    @classmethod
    def from_dir(cls, path: str | Path) -> WordPieceTokenizer:
        """Load ``tokenizer.json``, else ``vocab.txt`` (+ ``tokenizer_config.json``), from a dir."""
        path = Path(path)
        if (path / "tokenizer.json").is_file():
            return cls.load(path / "tokenizer.json")
        if (path / "vocab.txt").is_file():
            config = path / "tokenizer_config.json"
            options = read_json(config, "tokenizer config", keys={}) if config.is_file() else {}
            return cls.from_vocab(
                path / "vocab.txt",
                lowercase=bool(options.get("do_lower_case", True)),
                chinese_chars=bool(options.get("tokenize_chinese_chars", True)),
                strip_accents=options.get("strip_accents"),
            )
        raise UserError(
            f"{path} has neither tokenizer.json nor vocab.txt; a BERT checkpoint directory "
            "needs one of them"
        )

    @classmethod
    def load(cls, path: str | Path) -> WordPieceTokenizer:
        """Read a ``tokenizer.json`` (Hugging Face format) with a WordPiece model."""
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as err:  # the library raises a bare Exception for bad files
            raise DataError(
                path, f"not a readable tokenizer.json ({err})", "re-export it"
            ) from None
        kind = json.loads(tok.to_str())["model"]["type"]
        if kind != "WordPiece":
            raise DataError(path, f"a {kind} tokenizer, not WordPiece", "use a BERT tokenizer")
        return cls(tok)

    @classmethod
    def from_vocab(
        cls,
        vocab_file: str | Path,
        lowercase: bool = True,
        chinese_chars: bool = True,
        strip_accents: bool | None = None,
    ) -> WordPieceTokenizer:
        """BERT's pipeline around a ``vocab.txt`` (one piece per line, the line is its id).

        ``chinese_chars`` puts spaces around every CJK ideograph, so each becomes a word of its
        own (``tokenize_chinese_chars`` of BERT, on by default: bert-base-chinese relies on it);
        ``strip_accents`` None follows ``lowercase``, as in BERT.
        """
        pieces = read_utf8(vocab_file, "vocabulary file").split("\n")
        vocab = {piece: i for i, piece in enumerate(pieces) if piece}
        model = WordPiece(vocab, unk_token=UNK)
        return cls(_bert_pipeline(model, lowercase, chinese_chars, strip_accents))

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int = 8000,
        min_frequency: int = 2,
        lowercase: bool = True,
    ) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary (specials first: [PAD]=0, [UNK], [CLS], [SEP], [MASK]).

        Chinese characters are split apart by the normaliser, so on Chinese text the
        vocabulary is essentially characters (plus pieces of any Latin words and numbers).
        """
        if vocab_size <= len(SPECIALS):
            raise UserError(
                f"vocab_size must exceed the {len(SPECIALS)} specials, got {vocab_size}"
            )
        tok = _bert_pipeline(WordPiece(unk_token=UNK), lowercase)
        texts = list(texts)
        suffixes = continuation_pieces(tok, texts)
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=[*SPECIALS, *suffixes],
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        return cls(_drop_added(tok, set(suffixes)))


def _bert_pipeline(
    model: WordPiece,
    lowercase: bool,
    chinese_chars: bool = True,
    strip_accents: bool | None = None,
) -> Tokenizer:
    """A Tokenizer with BERT's normaliser, pre-tokeniser and decoder around ``model``."""
    tok = Tokenizer(model)
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=chinese_chars,
        strip_accents=strip_accents,
        lowercase=lowercase,
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _is_cjk(char: str) -> bool:
    """A CJK ideograph, in the ranges BERT's tokenize_chinese_chars splits apart."""
    cp = ord(char)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
