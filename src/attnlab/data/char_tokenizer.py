"""Character-level tokenizer: one id per Unicode code point, with pad/unk/cls/mask specials.

Text is not normalised: full-width and half-width forms ("，" and ",", "Ａ" and "A") get separate
ids. This keeps position i of `encode(text)` aligned with `text[i]` (NFKC would turn one
character such as "㎏" into two), so attention heatmap axes show exactly what the model read.
The cost is a slightly larger vocabulary; normalise the texts yourself before `build` if wanted.

Truncation keeps the head: `encode(text, max_len)` returns the first `max_len` ids (the `<cls>`
id counts towards `max_len` when added) and drops the rest.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence

from attnlab.data.errors import DataError
from attnlab.data.io import read_json, write_json
from attnlab.errors import UserError

PAD, UNK, CLS, MASK = "<pad>", "<unk>", "<cls>", "<mask>"
SPECIALS = (PAD, UNK, CLS, MASK)  # ids 0..3; <mask> is reserved for masked-LM pretraining
PAD_ID, UNK_ID, CLS_ID, MASK_ID = range(len(SPECIALS))
_FORMAT = "attnlab.char_tokenizer"


class CharTokenizer:
    """Maps each character to an id; unknown characters map to `<unk>`."""

    def __init__(self, vocab: Sequence[str]) -> None:
        if tuple(vocab[: len(SPECIALS)]) != SPECIALS:
            raise UserError(f"vocab must start with the specials {SPECIALS}")
        chars = vocab[len(SPECIALS) :]
        bad = [c for c in chars if len(c) != 1]
        if bad:
            raise UserError(f"vocab entries after the specials must be single characters: {bad}")
        if len(set(vocab)) != len(vocab):
            raise UserError("vocab has repeated entries")
        self.id_to_token: list[str] = list(vocab)
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(vocab)}

    @classmethod
    def build(
        cls, texts: Iterable[str], min_freq: int = 1, max_vocab: int | None = None
    ) -> CharTokenizer:
        """Build from training texts: characters seen >= min_freq times, most frequent first.

        `max_vocab` caps the total size including the 4 specials; ties in frequency are broken
        by code point so the result never depends on text order.
        """
        if min_freq < 1:
            raise UserError(f"min_freq must be >= 1, got {min_freq}")
        if max_vocab is not None and max_vocab <= len(SPECIALS):
            raise UserError(f"max_vocab must exceed the {len(SPECIALS)} specials, got {max_vocab}")
        counts = Counter(c for text in texts for c in text)
        chars = sorted(
            (c for c, n in counts.items() if n >= min_freq), key=lambda c: (-counts[c], c)
        )
        if max_vocab is not None:
            chars = chars[: max_vocab - len(SPECIALS)]
        return cls([*SPECIALS, *chars])

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included (the embedding table size)."""
        return len(self.id_to_token)

    def encode(
        self, text: str, max_len: int, add_cls: bool = False, tail_share: float = 0.0
    ) -> list[int]:
        """Ids of `text`, optionally after a leading `<cls>`, at most `max_len` of them.

        A longer text keeps its head, or with `tail_share` > 0 its head and its last
        round(tail_share * room) characters (head+tail truncation, Sun et al. 2019: reviews often
        end with the verdict).
        """
        if max_len < 1:
            raise UserError(f"max_len must be >= 1, got {max_len}")
        if not 0.0 <= tail_share <= 1.0:
            raise UserError(f"tail_share must be in [0, 1], got {tail_share}")
        ids = [CLS_ID] if add_cls else []
        room = max_len - len(ids)
        if len(text) > room:
            tail = round(tail_share * room)
            text = text[: room - tail] + (text[len(text) - tail :] if tail else "")
        ids.extend(self.token_to_id.get(c, UNK_ID) for c in text)
        return ids

    def tokens(
        self, text: str, max_len: int, add_cls: bool = False, tail_share: float = 0.0
    ) -> list[str]:
        """Per-position strings the model sees for the same `encode` call (heatmap axes).

        Unknown characters appear as "<unk>", because that is what the model read there.
        """
        return [self.id_to_token[i] for i in self.encode(text, max_len, add_cls, tail_share)]

    def decode(self, ids: Iterable[int], skip_specials: bool = True) -> str:
        """Text of `ids`; drops `<pad>`, `<cls>` and `<mask>` unless told not to, keeps `<unk>`."""
        dropped = {PAD_ID, CLS_ID, MASK_ID} if skip_specials else set()
        out = []
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise UserError(f"id {i} is outside the vocabulary (size {self.vocab_size})")
            if i not in dropped:
                out.append(self.id_to_token[i])
        return "".join(out)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the vocabulary as UTF-8 JSON (characters kept readable), atomically."""
        write_json(path, {"format": _FORMAT, "version": 1, "vocab": self.id_to_token})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CharTokenizer:
        """Read a tokenizer written by `save`."""
        data = read_json(path, "tokenizer")
        fix = "rebuild the tokenizer with CharTokenizer.build and save it again"
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise DataError(path, "not an attnlab character tokenizer file", fix)
        try:
            return cls(data["vocab"])
        except (KeyError, TypeError, ValueError) as err:
            raise DataError(path, f"invalid tokenizer vocabulary ({err})", fix) from None
