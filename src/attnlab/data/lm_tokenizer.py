"""Tokenizers of the language model: characters, or byte-level BPE; saved as one JSON file.

The character tokenizer is nanoGPT's: the sorted set of characters of the corpus, no specials,
so a prompt with a character the corpus never had is an error (byte-level BPE has no unknowns).
Encoding goes through a numpy lookup table, so a large corpus never becomes a Python list.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import numpy as np

from attnlab.data.bpe import BPETokenizer
from attnlab.data.io import read_json, write_json
from attnlab.errors import UserError

FORMAT = "attnlab.lm_tokenizer"
KINDS = ("char", "gpt2", "bpe")


class LMTokenizer(Protocol):
    """What the language-model task needs from a tokenizer."""

    kind: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def to_json(self) -> dict: ...


class CharLMTokenizer:
    """One id per character of a fixed alphabet (sorted by code point), nothing else."""

    kind = "char"

    def __init__(self, chars: Iterable[str]) -> None:
        self.chars = sorted(set(chars))
        if not self.chars or any(len(c) != 1 for c in self.chars):
            raise UserError("a character vocabulary needs at least one single-character entry")
        codes = np.array([ord(c) for c in self.chars], dtype=np.int64)
        self._lut = np.full(int(codes.max()) + 1, -1, dtype=np.int64)  # code point -> id
        self._lut[codes] = np.arange(len(codes))
        self._chars = np.array(self.chars)

    @classmethod
    def build(cls, texts: Iterable[str]) -> CharLMTokenizer:
        """The alphabet of ``texts``."""
        seen: set[str] = set()
        for text in texts:
            seen.update(text)
        if not seen:
            raise UserError("the corpus is empty: there are no characters to build a vocabulary")
        return cls(seen)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode_array(self, text: str) -> np.ndarray:
        """Ids of ``text`` as an int64 array (T,); unknown characters raise a ValueError."""
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)  # (T,)
        inside = codes < len(self._lut)
        ids = np.full(codes.shape, -1, dtype=np.int64)
        ids[inside] = self._lut[codes[inside]]
        if (ids < 0).any():
            unknown = sorted({chr(c) for c in codes[ids < 0].tolist()})
            shown = ", ".join(repr(c) for c in unknown[:20])
            raise UserError(
                f"{len(unknown)} character(s) are not in the model's vocabulary of "
                f"{self.vocab_size}: {shown}; remove or replace them (a character-level model "
                "only knows the characters of its training corpus)"
            )
        return ids

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def decode(self, ids: list[int]) -> str:
        return "".join(self._chars[np.asarray(ids, dtype=np.int64)].tolist())

    def to_json(self) -> dict:
        return {"kind": self.kind, "chars": "".join(self.chars)}


def encode_array(tokenizer: LMTokenizer, text: str) -> np.ndarray:
    """Ids of ``text`` as an int64 array, without a Python list for the character tokenizer."""
    if isinstance(tokenizer, CharLMTokenizer):
        return tokenizer.encode_array(text)
    return np.asarray(tokenizer.encode(text), dtype=np.int64)


def save_tokenizer(tokenizer: LMTokenizer, path: str | Path) -> None:
    """Write ``tokenizer`` as JSON (the BPE ones include their whole merge table)."""
    write_json(Path(path), {"format": FORMAT, **tokenizer.to_json()})


def load_tokenizer(path: str | Path) -> LMTokenizer:
    """Read a tokenizer written by `save_tokenizer`."""
    data = read_json(Path(path), "tokenizer")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"{path} is not an attnlab language-model tokenizer file")
    if data["kind"] == "char":
        return CharLMTokenizer(data["chars"])
    if data["kind"] in ("gpt2", "bpe"):
        return BPETokenizer.from_json(data)
    raise UserError(f"{path}: unknown tokenizer kind {data['kind']!r}; expected one of {KINDS}")
