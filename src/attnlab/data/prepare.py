"""The texts of a classification run: corpus, split, extra training examples and labels.

``prepare_texts`` turns a run's data settings into :class:`TextSplits`: the corpus (a named one
or the user's file), its train / val / test split (saved in split.json; read back when a run
resumes from a checkpoint; given by separate files; or drawn stratified from ``split_seed``), a
stratified sample of the training split when ``train_examples`` is set, the extra training
examples (:func:`attnlab.data.sentiment.extra_examples`) and the label vocabulary. Nothing here
knows a model: how the texts are read is the run's reader's business.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.data.corpus import LabeledCorpus
from attnlab.data.labels import LabelVocab, check_label_counts
from attnlab.data.sentiment import extra_examples, held_out_texts, load_corpus
from attnlab.data.splits import (
    check_labels,
    load_split,
    save_split,
    stratified_sample,
    stratified_split,
)
from attnlab.errors import UserError


@dataclass
class TextSplits:
    """A run's labelled texts by split; the training split ends with the extra examples."""

    corpus: LabeledCorpus
    split: dict[str, list[int]]
    extra: LabeledCorpus | None
    labels: LabelVocab
    report: dict[str, Any] = field(default_factory=dict)

    def texts(self, name: str) -> tuple[list[str], list[str]]:
        """Texts and string labels of one split (train: the extra examples last)."""
        idx = self.split[name]
        texts = [self.corpus.texts[i] for i in idx]
        labels = [self.corpus.labels[i] for i in idx]
        if name == "train" and self.extra is not None:
            texts, labels = texts + self.extra.texts, labels + self.extra.labels
        return texts, labels

    def split_data(self, name: str) -> tuple[list[str], list[int]]:
        """Texts and integer labels of one split."""
        texts, labels = self.texts(name)
        return texts, self.labels.encode(labels)

    @property
    def n_main(self) -> int:
        """How many training texts are the corpus's own (the extra examples follow them)."""
        return len(self.split["train"])

    def save_split(self, path: Path) -> None:
        save_split(path, self.split, self.corpus.texts)


def prepare_texts(d: Any, run_dir: Path, resume: bool) -> TextSplits:
    """The run's texts from its data settings ``d`` (a classify data section): the corpus and
    its split (:func:`split_texts`), then the extra training examples (:func:`add_extra`)."""
    return add_extra(split_texts(d, run_dir, resume), d)


def split_texts(d: Any, run_dir: Path, resume: bool) -> TextSplits:
    """The corpus and its train / val / test split, without extra examples; with ``resume``
    (a checkpoint will be restored) the split comes from the run's split.json. Every row of
    every file is read and checked here, before any model work."""
    corpus, given = load_corpus(
        d.data, d.text_col, d.label_col, d.val_data, d.test_data, d.max_examples, d.split_seed
    )
    split_path = run_dir / "split.json"
    if resume and split_path.exists():
        split = load_split(split_path, corpus.texts)
    else:
        split = given if given is not None else _draw_split(corpus, d)
        if given is not None and not split["val"] and d.val_ratio > 0:
            _carve_validation(corpus, split, d.val_ratio, d.split_seed)
        keep = stratified_sample([corpus.labels[i] for i in split["train"]], d.train_examples,
                                 d.split_seed)  # fmt: skip
        split["train"] = [split["train"][j] for j in keep]
    if not split["val"]:
        raise UserError(
            "the validation split is empty; give --val-data or a val_ratio > 0 (early stopping "
            "and the choice of the best checkpoint need it)"
        )
    train_labels = [corpus.labels[i] for i in split["train"]]
    rare = check_label_counts(train_labels, d.allow_rare_labels)
    for name in ("val", "test"):
        check_labels(train_labels, [corpus.labels[i] for i in split[name]], name)
    splits = TextSplits(corpus, split, None, LabelVocab.build(train_labels))
    splits.report = {"source": corpus.source, "corpus_stats": corpus.stats, "rare_labels": rare}
    return splits


def add_extra(
    splits: TextSplits, d: Any, rename: Mapping[str, str] | None = None
) -> TextSplits:
    """``splits`` with the extra training examples ``d.extra_train`` names after its training
    split; ``rename`` maps the named sentiment sources' labels (positive, negative) to the
    corpus's own. The label vocabulary stays the corpus's: an extra label outside it is
    refused."""
    train_labels = [splits.corpus.labels[i] for i in splits.split["train"]]
    extra, extra_report = extra_examples(
        d.extra_train, set(train_labels), held_out_texts(splits.corpus, splits.split),
        text_col=d.text_col, label_col=d.label_col, negation=d.lexicon_negation,
        intensity=d.lexicon_intensity, n=d.extra_train_examples, seed=d.split_seed,
        rename=rename,
    )  # fmt: skip
    out = TextSplits(splits.corpus, splits.split, extra, splits.labels)
    out.report = {
        "source": splits.report["source"],
        "corpus_stats": splits.report["corpus_stats"],
        "split_sizes": {name: len(idx) for name, idx in out.split.items()},
        "label_counts": {
            name: dict(sorted(Counter(out.texts(name)[1]).items())) for name in out.split
        },
        "rare_labels": splits.report["rare_labels"],
        "extra_training": extra_report or None,
    }
    return out


def _draw_split(corpus: LabeledCorpus, d: Any) -> dict[str, list[int]]:
    ratios = (1.0 - d.val_ratio - d.test_ratio, d.val_ratio, d.test_ratio)
    return stratified_split(corpus.labels, ratios, d.split_seed)


def _carve_validation(
    corpus: LabeledCorpus, split: dict[str, list[int]], ratio: float, seed: int
) -> None:
    """A validation share of the training file, when only a test file was given (in place)."""
    train = split["train"]
    inner = stratified_split([corpus.labels[i] for i in train], (1 - ratio, ratio, 0.0), seed)
    split["train"] = [train[i] for i in inner["train"]]
    split["val"] = [train[i] for i in inner["val"]]
