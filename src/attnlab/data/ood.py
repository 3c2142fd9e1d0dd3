"""The out-of-domain sentiment sets: hand-written reviews kept out of training, for evaluation.

`src/attnlab/data/sentiment_ood/{dev,test}.tsv` (columns text, label, domain, phenomenon; data
card beside them) hold short reviews of films, series, restaurants, hotels, games and apps that
the bundled shopping/book/hotel corpus lacks. `dev` may be used to choose settings; `test` is only
scored. Neither ever enters training: `ood_texts()` is what the classifier task filters its
extra training examples against.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.data.corpus import LabeledCorpus
from attnlab.data.io import read_utf8
from attnlab.data.tabular import _delimited_rows, load_labeled_file

OOD_DIR = Path(__file__).resolve().parent / "sentiment_ood"
SPLITS = ("dev", "test")


def ood_files(root: Path = OOD_DIR) -> dict[str, Path]:
    """{split: path} of the OOD files that exist (none before they are committed)."""
    return {name: root / f"{name}.tsv" for name in SPLITS if (root / f"{name}.tsv").is_file()}


def load_ood(name: str, root: Path = OOD_DIR) -> tuple[LabeledCorpus, list[dict[str, str]]]:
    """One OOD split as a corpus, plus each row's {domain, phenomenon} for breakdowns."""
    path = root / f"{name}.tsv"
    corpus = load_labeled_file(path, "text", "label")
    rows = _delimited_rows(path, read_utf8(path), "\t", "text", "label")
    tags = [{k: row.get(k, "").strip() for k in ("domain", "phenomenon")} for _, row in rows]
    return corpus, tags


def ood_texts(root: Path = OOD_DIR) -> set[str]:
    """Every OOD text (dev and test), for keeping them out of training."""
    texts: set[str] = set()
    for path in ood_files(root).values():
        texts.update(load_labeled_file(path, "text", "label").texts)
    return texts
