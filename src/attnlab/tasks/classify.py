"""Text classification end to end: data, model, training, evaluation, prediction, heatmaps.

A run directory holds everything another command needs:
config.json (task, data, model and training configs), tokenizer.json, labels.json, split.json,
data_report.json, model.safetensors (best by validation), metrics.jsonl, tensorboard/, state/,
curves.png, summary.json, results.json and test_report.txt.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.configs import from_dict, to_dict
from attnlab.data import (
    CharTokenizer,
    ClassificationData,
    LabeledCorpus,
    LabelVocab,
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
from attnlab.data.io import write_json
from attnlab.metrics import classification_report, format_report
from attnlab.models.classifier import (
    ClassifierConfig,
    TextClassifier,
    TextClassifierEnsemble,
    build_classifier,
)
from attnlab.tasks import sections
from attnlab.tasks.sections import PRESETS
from attnlab.train import StepOutput, TrainConfig, Trainer, load_weights, seed_everything

TASK = "classify"

# The tutorial's own examples and the label each must get.
TUTORIAL_EXAMPLES = (
    ("这部电影看得我热血沸腾，情节紧凑。", "positive"),
    ("剧情拖沓，演员演技一言难尽。", "negative"),
    ("电影前半段很无聊，但是结局让我感动", "positive"),
)


@dataclass
class ClassifyConfig:
    """Data and loss options of the classification task (the model and loop have their own)."""

    data: str = field(default="", metadata={"help": "CSV/TSV/JSONL file; empty = bundled reviews"})
    val_data: str = field(default="", metadata={"help": "separate validation file (optional)"})
    test_data: str = field(default="", metadata={"help": "separate test file (optional)"})
    text_col: str = "text"
    label_col: str = "label"
    split_seed: int = field(default=0, metadata={"help": "seed of the 80/10/10 stratified split"})
    val_ratio: float = 0.1
    test_ratio: float = 0.1
    min_freq: int = field(default=2, metadata={"help": "rarer characters become <unk>"})
    len_percentile: float = field(
        default=95.0, metadata={"help": "truncation length covers this % of train texts"}
    )
    truncate_len: int = field(default=0, metadata={"help": "fixed truncation length; 0 = auto"})
    max_truncate_len: int = 512
    tail_share: float = field(
        default=0.0, metadata={"help": "share of a truncated text's room kept from its end"}
    )
    label_smoothing: float = 0.1
    eval_batch_size: int = 256

    def __post_init__(self) -> None:
        if not 0.0 <= self.tail_share <= 1.0:
            raise ValueError(
                f"tail_share must be in [0, 1] (0 = keep the head), got {self.tail_share}"
            )


SECTIONS: dict[str, type] = {
    "data": ClassifyConfig,
    "model": ClassifierConfig,
    "train": TrainConfig,
}


@dataclass
class RunConfig:
    """The three configs of a classification run, as saved in config.json."""

    data: ClassifyConfig
    model: ClassifierConfig
    train: TrainConfig

    def to_json(self) -> dict[str, Any]:
        return {"task": TASK, **{name: to_dict(getattr(self, name)) for name in SECTIONS}}


def field_owner() -> dict[str, str]:
    """Which section each command-line field belongs to."""
    return sections.field_owner(SECTIONS)


def build_config(preset: str | Path | None, overrides: dict[str, Any]) -> RunConfig:
    """Defaults <- presets/classify.toml <- a user preset (file or bundled name) <- fields."""
    sources = [PRESETS / f"{TASK}.toml"]
    if preset:
        sources.append(sections.preset_file(preset, TASK))
    return RunConfig(**sections.build_sections(SECTIONS, sources, overrides))


# ---------------------------------------------------------------------------- data


def load_corpus(dcfg: ClassifyConfig) -> tuple[LabeledCorpus, dict[str, list[int]] | None]:
    """The bundled reviews, or the user's file(s); a split comes back when files define it."""
    if not dcfg.data:
        if dcfg.val_data or dcfg.test_data:
            raise ValueError("--val-data/--test-data need --data (the training file) as well")
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
    for name in ("val", "test"):
        check_labels(train_labels, [corpus.labels[i] for i in split[name]], name)
    if not split["val"]:
        raise ValueError(
            "the validation split is empty; give --val-data or a val_ratio > 0 "
            "(early stopping and best-checkpoint selection need it)"
        )
    if resume and (run_dir / "tokenizer.json").exists():
        tokenizer = CharTokenizer.load(run_dir / "tokenizer.json")
        labels = LabelVocab.load(run_dir / "labels.json")
        max_len = json.loads((run_dir / "data_report.json").read_text())["max_len"]
    else:
        tokenizer = CharTokenizer.build(train_texts, min_freq=dcfg.min_freq)
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
    }
    return Prepared(corpus, split, tokenizer, labels, max_len, report, dcfg.tail_share)


def _count(items: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return dict(sorted(counts.items()))


def make_dataset(
    prep: Prepared, name: str, add_cls: bool, batch_size: int, shuffle: bool, seed: int
) -> ClassificationData:
    """Encoded, length-bucketed data for one split."""
    idx = prep.split[name]
    return ClassificationData.from_texts(
        [prep.corpus.texts[i] for i in idx],
        [prep.corpus.labels[i] for i in idx],
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
            logits = model(batch["input_ids"], batch["lengths"])  # (B, C)
            loss = F.cross_entropy(logits, batch["labels"], label_smoothing=label_smoothing)
        acc = (logits.argmax(-1) == batch["labels"]).float().mean().item()
        return StepOutput(loss=loss, weight=len(batch["labels"]), metrics={"acc": acc})

    return step


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
        batch = data.collate(indices)
        logits = model(batch["input_ids"].to(device), batch["lengths"].to(device))
        loss_sum += F.cross_entropy(logits, batch["labels"].to(device), reduction="sum").item()
        order += list(indices)
        preds += logits.argmax(-1).tolist()
    model.train(was_training)
    pred_by_index = dict(zip(order, preds))
    y_pred = [pred_by_index[i] for i in range(len(data))]
    return list(data.labels), y_pred, loss_sum / max(len(data), 1)


def evaluator(data: ClassificationData, labels: LabelVocab, device: str):
    """Validation metrics for the engine: val_loss, val_acc, val_macro_f1."""

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        y_true, y_pred, loss = predict_dataset(model, data, device)  # type: ignore[arg-type]
        report = classification_report(y_true, y_pred, labels.labels)
        return {"val_loss": loss, "val_acc": report["accuracy"], "val_macro_f1": report["macro_f1"]}

    return evaluate


def train(
    run_dir: str | Path,
    overrides: dict[str, Any] | None = None,
    preset: str | Path | None = None,
    resume: bool = False,
    device: str = "cpu",
) -> dict[str, Any]:
    """Train a classifier into ``run_dir``; returns the summary with test metrics."""
    run_dir = Path(run_dir)
    cfg = build_config(preset, overrides or {})
    main = int(os.environ.get("RANK", "0")) == 0
    sections.refuse_existing_run(run_dir, resume)
    prep = prepare(cfg, run_dir, resume)
    add_cls = cfg.model.pooling == "cls"
    cfg.model.vocab_size = prep.tokenizer.vocab_size
    cfg.model.n_classes = len(prep.labels)
    cfg.model.context = max(cfg.model.context, prep.max_len)
    train_data = make_dataset(prep, "train", add_cls, cfg.train.batch_size, True, cfg.train.seed)
    val_data = make_dataset(prep, "val", add_cls, cfg.data.eval_batch_size, False, 0)
    lengths = [len(s) for s in train_data.sequences]
    prep.report["padding_fraction_bucketed"] = padding_fraction(train_data.batches(0), lengths)
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not resume or not (run_dir / "config.json").exists():
            write_json(run_dir / "config.json", cfg.to_json())
            prep.tokenizer.save(run_dir / "tokenizer.json")
            prep.labels.save(run_dir / "labels.json")
            save_split(run_dir / "split.json", prep.split, prep.corpus.texts)
            write_json(run_dir / "data_report.json", prep.report)
        _print_data_report(prep.report)
    seed_everything(cfg.train.seed)
    model = build_classifier(cfg.model)
    if main:
        n_params = sum(p.numel() for p in model.parameters())
        print(
            f"model: {n_params / 1e6:.2f}M parameters, {cfg.model.n_layers} layers, "
            f"d_model {cfg.model.d_model}, {cfg.model.n_heads} heads, pos {cfg.model.pos}, "
            f"pooling {cfg.model.pooling}, {cfg.model.norm_position}-norm"
            + (f"; {cfg.model.members} such models, an ensemble" if cfg.model.members > 1 else ""),
            file=sys.stderr,
        )
    trainer = Trainer(
        model,
        cfg.train,
        run_dir,
        train_data,
        step_fn(cfg.data.label_smoothing),
        evaluate=evaluator(val_data, prep.labels, device),
        device=device,
    )
    summary = trainer.fit(resume=resume)
    if not main:
        return summary
    load_weights(model, run_dir / "model.safetensors")
    model.to(device)
    test = evaluate_split(model, prep, "test", add_cls, cfg.data.eval_batch_size, device)
    val = evaluate_split(model, prep, "val", add_cls, cfg.data.eval_batch_size, device)
    results = {
        "summary": summary,
        "val": val,
        "test": test,
        "n_params": sum(p.numel() for p in model.parameters()),
    }
    if test is not None:
        (run_dir / "test_report.txt").write_text(format_report(test) + "\n", encoding="utf-8")
    write_json(run_dir / "results.json", results)
    return results


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


def _print_data_report(report: dict[str, Any]) -> None:
    sizes = ", ".join(f"{k} {v}" for k, v in report["split_sizes"].items())
    print(f"data: {report['source']}; {sizes}", file=sys.stderr)
    print(f"labels: {report['label_counts']['train']} (train)", file=sys.stderr)
    print(
        f"vocab {report['vocab_size']} characters; max_len {report['max_len']} "
        f"({report['len_percentile']}th percentile): {report['truncation']}; "
        f"padding {report['padding_fraction_bucketed']:.1%} with length buckets",
        file=sys.stderr,
    )


# ---------------------------------------------------------------------------- a trained run


@dataclass
class ClassifierRun:
    """A trained run directory loaded for inference."""

    run_dir: Path
    config: RunConfig
    model: TextClassifier | TextClassifierEnsemble
    tokenizer: CharTokenizer
    labels: LabelVocab
    max_len: int

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "cpu") -> ClassifierRun:
        run_dir = Path(run_dir)
        config_path = run_dir / "config.json"
        if not config_path.exists():
            raise ValueError(
                f"{run_dir} is not a run directory (no config.json); "
                "train one with `attnlab train classify --out DIR`"
            )
        raw = json.loads(config_path.read_text(encoding="utf-8"))
        if raw.get("task") != TASK:
            raise ValueError(f"{run_dir} holds a {raw.get('task')!r} run, not a classifier")
        if not (run_dir / "model.safetensors").exists():
            raise ValueError(
                f"{run_dir} has no model.safetensors yet; training has not "
                "finished its first evaluation (resume it with --resume)"
            )
        config = RunConfig(**{name: from_dict(c, raw[name]) for name, c in SECTIONS.items()})
        model = build_classifier(config.model)
        load_weights(model, run_dir / "model.safetensors")
        model.to(device).eval()
        max_len = json.loads((run_dir / "data_report.json").read_text())["max_len"]
        return cls(
            run_dir,
            config,
            model,
            CharTokenizer.load(run_dir / "tokenizer.json"),
            LabelVocab.load(run_dir / "labels.json"),
            max_len,
        )

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
            if not text.strip():
                raise ValueError(f"text {i + 1} is empty; give some characters to classify")
        seqs = [self.encode_text(t) for t in texts]
        return pad_batch(seqs)

    @torch.no_grad()
    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """Label and per-class probabilities for each text."""
        ids, lengths = self.encode(texts)
        probs = torch.softmax(self.model(ids, lengths), dim=-1)  # (B, C)
        out = []
        for text, p in zip(texts, probs):
            k = int(p.argmax())
            out.append(
                {
                    "text": text,
                    "label": self.labels.labels[k],
                    "probs": {label: float(p[i]) for i, label in enumerate(self.labels.labels)},
                }
            )
        return out

    def inspect(self, text: str, member: int = 0) -> dict[str, Any]:
        """Tokens, attention (L, H, T, T), token shares and the prediction for one text.

        For an ensemble, attention and shares are those of member ``member``; the prediction is
        the ensemble's."""
        ids, lengths = self.encode([text])
        if isinstance(self.model, TextClassifierEnsemble):
            info = self.model.inspect(ids, lengths, member)
        elif member != 0:
            raise ValueError(
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
            "attention": info["attention"][:, 0],
            "token_share": info["token_share"][0],
            "label": self.labels.labels[k],
            "prob": float(probs[k]),
        }
