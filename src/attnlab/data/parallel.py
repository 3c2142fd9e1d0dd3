"""Parallel text for translation: pair files, synthetic copy/reverse pairs, tokenizers, batches.

A pair file is a TSV (``source<TAB>target[<TAB>group]``) or JSONL (``{"src", "tgt"[, "group"]}``)
file, optionally gzip-compressed. ``group`` (e.g. ``Genesis 1``) keeps related lines in one split.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from attnlab.data.buckets import LengthBucketSampler
from attnlab.data.errors import DataError
from attnlab.data.io import clean_strings
from attnlab.errors import UserError

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]  # ids 0, 1, 2, 3 in every vocabulary


@dataclass(frozen=True)
class Pair:
    """One aligned sentence pair and the group that decides its split."""

    src: str
    tgt: str
    group: str


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def read_pairs(path: str | Path) -> list[Pair]:
    """Pairs of a TSV or JSONL file; a bad line raises DataError with its line number."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "no such file", "pass a TSV or JSONL file of sentence pairs")
    jsonl = ".jsonl" in path.suffixes or ".json" in path.suffixes
    pairs: list[Pair] = []
    n = 0
    try:
        with _open_text(path) as f:
            for n, line in enumerate(f, start=1):
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                pair = _parse_json(path, n, line) if jsonl else _parse_tsv(path, n, line)
                pairs.append(pair)
    except UnicodeDecodeError:
        raise DataError(path, "is not valid UTF-8", "re-save the file as UTF-8", n + 1) from None
    if not pairs:
        raise DataError(path, "no sentence pairs", "give one pair per line")
    return pairs


def _parse_tsv(path: Path, n: int, line: str) -> Pair:
    cols = line.split("\t")
    if len(cols) not in (2, 3):
        raise DataError(
            path, f"{len(cols)} tab-separated columns", "write source<TAB>target[<TAB>group]", n
        )
    src, tgt = cols[0].strip(), cols[1].strip()
    if not src or not tgt:
        raise DataError(path, "an empty source or target", "drop the line or fill it in", n)
    return Pair(src, tgt, cols[2].strip() if len(cols) == 3 else f"line {n}")


def _parse_json(path: Path, n: int, line: str) -> Pair:
    try:
        obj = clean_strings(json.loads(line))  # a lone surrogate escape: U+FFFD
    except json.JSONDecodeError as err:
        raise DataError(
            path, f"invalid JSON ({err.msg})", "write one JSON object a line", n
        ) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("src"), str):
        raise DataError(path, "no string field 'src'", 'write {"src": ..., "tgt": ...}', n)
    if not isinstance(obj.get("tgt"), str):
        raise DataError(path, "no string field 'tgt'", 'write {"src": ..., "tgt": ...}', n)
    if not obj["src"].strip() or not obj["tgt"].strip():
        raise DataError(path, "an empty source or target", "drop the line or fill it in", n)
    return Pair(obj["src"].strip(), obj["tgt"].strip(), str(obj.get("group", f"line {n}")))


def synthetic_pairs(
    task: str, n: int, seed: int, min_len: int = 3, max_len: int = 12, alphabet: int = 20
) -> list[Pair]:
    """``n`` random letter strings and their copy or reversal (seeded); each its own group."""
    if task not in ("copy", "reverse"):
        raise UserError(f"synthetic task must be copy or reverse, got {task!r}")
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"[:alphabet]
    pairs = []
    for i in range(n):
        s = "".join(rng.choice(letters) for _ in range(rng.randint(min_len, max_len)))
        pairs.append(Pair(s, s if task == "copy" else s[::-1], f"{i}"))
    return pairs


def split_of(group: str, dev_percent: float, test_percent: float) -> str:
    """train / dev / test from a stable hash of the group (the same on every machine)."""
    h = int(hashlib.md5(group.encode()).hexdigest()[:8], 16) % 10_000 / 100.0
    return "test" if h < test_percent else "dev" if h < test_percent + dev_percent else "train"


def split_pairs(
    pairs: Sequence[Pair], dev_percent: float = 2.0, test_percent: float = 2.0
) -> dict[str, list[Pair]]:
    """Deterministic split by group (book and chapter for the Bible corpus)."""
    out: dict[str, list[Pair]] = {"train": [], "dev": [], "test": []}
    for p in pairs:
        out[split_of(p.group, dev_percent, test_percent)].append(p)
    for name, part in out.items():
        if not part:
            raise UserError(
                f"the {name} split is empty ({len(pairs)} pairs in all); give more pairs or "
                "raise dev_percent/test_percent"
            )
    return out


# ---------------------------------------------------------------------------- tokenizers


class TextTokenizer:
    """A ``tokenizers`` model (BPE, unigram or characters) with <pad> <s> </s> <unk> = 0..3."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], kind: str, vocab_size: int) -> TextTokenizer:
        """Train on ``texts``: ``bpe``/``unigram`` subwords (Metaspace), or ``char``."""
        if kind == "bpe":
            tok = Tokenizer(models.BPE(unk_token=UNK))
            trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS)
        elif kind == "unigram":
            tok = Tokenizer(models.Unigram())
            trainer = trainers.UnigramTrainer(
                vocab_size=vocab_size, special_tokens=SPECIALS, unk_token=UNK
            )
        elif kind == "char":
            tok = Tokenizer(models.WordLevel(unk_token=UNK))
            trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=SPECIALS)
        else:
            raise UserError(f"tokenizer must be bpe, unigram or char, got {kind!r}")
        tok.normalizer = normalizers.NFKC()
        if kind == "char":
            tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
            tok.decoder = decoders.Fuse()
        else:
            tok.pre_tokenizer = pre_tokenizers.Metaspace()
            tok.decoder = decoders.Metaspace()
        tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def save(self, path: Path) -> None:
        path.write_text(self.tok.to_str())

    @classmethod
    def load(cls, path: Path) -> TextTokenizer:
        """The tokenizer saved at ``path``; a damaged file is one UserError naming it."""
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as err:  # the Rust library raises a bare Exception for a bad file
            why = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise UserError(
                f"{path}: not a readable tokenizer file ({why}); restore it, or retrain the run"
            ) from None
        if [tok.token_to_id(t) for t in SPECIALS] != list(range(len(SPECIALS))):
            raise UserError(
                f"{path}: not a tokenizer of a translation run (it lacks the special tokens "
                f"{' '.join(SPECIALS)} as ids 0..{len(SPECIALS) - 1}); restore it, or retrain"
            )
        return cls(tok)


# ---------------------------------------------------------------------------- batches


class ParallelData:
    """Token ids of a split and token-budget batches (the engine's TrainData)."""

    def __init__(
        self,
        src: list[list[int]],
        tgt: list[list[int]],
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        self.src, self.tgt = src, tgt
        # a batch pays for its longest source or target (with BOS/EOS)
        self.lengths = [max(len(s), len(t) + 1) for s, t in zip(src, tgt)]
        self.sampler = LengthBucketSampler(
            self.lengths, shuffle=shuffle, seed=seed, max_tokens=max_tokens
        )

    def __len__(self) -> int:
        return len(self.src)

    def batches(self, epoch: int) -> list[list[int]]:
        return self.sampler.batches(epoch)

    def collate(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """src (B, S); tgt_in = <s> y (B, T); tgt_out = y </s> (B, T); right-padded with 0."""
        src = _pad([self.src[i] for i in indices])
        tgt_in = _pad([[1, *self.tgt[i]] for i in indices])
        tgt_out = _pad([[*self.tgt[i], 2] for i in indices])
        return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}

    def num_tokens(self, batch: dict[str, torch.Tensor]) -> int:
        return int((batch["tgt_out"] != 0).sum())


def _pad(rows: list[list[int]]) -> torch.Tensor:
    out = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out
