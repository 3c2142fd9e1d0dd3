"""Fine-tuning a pretrained BERT for text classification (`attnlab train classify --init`).

The encoder and its WordPiece tokenizer come from a checkpoint (all-MiniLM-L6-v2 by default,
or an `attnlab train mlm` run); a dropout + linear head on the pooled vector is added and the
whole network is trained with the generic engine. ``from_scratch`` keeps the checkpoint's
architecture and tokenizer but starts from BERT's random initialisation: the control arm of a
fair pretrained-vs-scratch comparison. The run directory mirrors the char-level classifier's
(config.json with task "bert_classify", labels.json, split.json, data_report.json,
tokenizer.json, model.safetensors, results.json), so `attnlab predict` / `eval` use it too.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlab.configs import from_dict, to_dict
from attnlab.data import (
    ClassificationData,
    LabeledCorpus,
    LabelVocab,
    LengthBucketSampler,
    check_labels,
    choose_max_len,
    load_chinese_reviews,
    load_labeled_file,
    load_split,
    save_split,
    stratified_split,
    truncation_report,
)
from attnlab.data.english_sentiment import CORPORA, balanced_subsample, load_english_sentiment
from attnlab.data.io import write_json
from attnlab.data.wordpiece import WordPieceTokenizer
from attnlab.metrics import classification_report, format_report
from attnlab.models.bert import BertClassifier, BertConfig
from attnlab.models.bert_checkpoint import load_pretrained, resolve_checkpoint
from attnlab.tasks import sections as config_sections
from attnlab.tasks.classify import evaluator, predict_dataset, step_fn
from attnlab.tasks.sections import PRESETS
from attnlab.train import TrainConfig, Trainer, load_weights, seed_everything

TASK = "bert_classify"


def _help(default: Any, text: str) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass
class BertClassifyConfig:
    """Data, head and initialisation options of BERT fine-tuning (the loop has TrainConfig)."""

    init: str = _help("minilm", "BERT checkpoint dir, `train mlm` run, or minilm")
    from_scratch: bool = _help(False, "with --init: its architecture, random weights")
    data: str = _help("pang_lee", "pang_lee, imdb, chinese_reviews or a CSV/TSV/JSONL file")
    text_col: str = "text"
    label_col: str = "label"
    max_examples: int = _help(0, "with --init: balanced random subsample first; 0 = all")
    split_seed: int = 0
    val_ratio: float = 0.1
    test_ratio: float = 0.1
    truncate_len: int = 0
    len_percentile: float = 99.0
    max_truncate_len: int = 256
    pooling: str = "mean"
    dropout: float = 0.1
    label_smoothing: float = 0.0
    eval_batch_size: int = 128


SECTIONS: dict[str, type] = {"data": BertClassifyConfig, "train": TrainConfig}


def build_sections(
    sections: dict[str, type], preset: str, user_preset: str | Path | None, overrides: dict
) -> dict[str, Any]:
    """Defaults <- attnlab's preset <- a user TOML <- command-line fields, per section."""
    sources = [PRESETS / f"{preset}.toml"]
    if user_preset:
        sources.append(config_sections.preset_file(user_preset, preset))
    return config_sections.build_sections(sections, sources, overrides)


def load_corpus(dcfg: BertClassifyConfig) -> LabeledCorpus:
    """The named corpus or the user's file, subsampled when ``max_examples`` is set."""
    if dcfg.data in CORPORA:
        corpus = load_english_sentiment(dcfg.data)
    elif dcfg.data == "chinese_reviews":
        corpus = load_chinese_reviews()
    else:
        corpus = load_labeled_file(dcfg.data, dcfg.text_col, dcfg.label_col)
    if dcfg.max_examples < 0:
        raise ValueError(f"max_examples must be >= 0 (0 = all), got {dcfg.max_examples}")
    if dcfg.max_examples:
        corpus = balanced_subsample(corpus, dcfg.max_examples, dcfg.split_seed)
    return corpus


def _dataset(
    texts: list[str],
    labels: list[int],
    tokenizer: WordPieceTokenizer,
    max_len: int,
    batch_size: int,
    shuffle: bool,
    seed: int,
) -> ClassificationData:
    """WordPiece-encoded, length-bucketed data for one split."""
    seqs = tokenizer.encode_batch(texts, max_len)
    sampler = LengthBucketSampler([len(s) for s in seqs], batch_size, shuffle=shuffle, seed=seed)
    return ClassificationData(seqs, labels, sampler, pad_id=tokenizer.pad_id)


def train(
    run_dir: str | Path,
    overrides: dict[str, Any] | None = None,
    preset: str | Path | None = None,
    resume: bool = False,
    device: str = "cpu",
) -> dict[str, Any]:
    """Fine-tune (or, with from_scratch, train) a BERT classifier; returns test metrics."""
    run_dir = Path(run_dir)
    config_sections.refuse_existing_run(run_dir, resume)
    parts = build_sections(SECTIONS, "bert_classify", preset, overrides or {})
    dcfg: BertClassifyConfig = parts["data"]
    tcfg: TrainConfig = parts["train"]
    checkpoint = resolve_checkpoint(dcfg.init)
    encoder, _, tokenizer, notes = load_pretrained(checkpoint)
    corpus = load_corpus(dcfg)
    split_path = run_dir / "split.json"
    if resume and split_path.exists():
        split = load_split(split_path, corpus.texts)
    else:
        ratios = (1.0 - dcfg.val_ratio - dcfg.test_ratio, dcfg.val_ratio, dcfg.test_ratio)
        split = stratified_split(corpus.labels, ratios, dcfg.split_seed)
    if not split["val"]:
        raise ValueError("the validation split is empty; set val_ratio > 0")
    texts = {name: [corpus.texts[i] for i in idx] for name, idx in split.items()}
    labels_str = {name: [corpus.labels[i] for i in idx] for name, idx in split.items()}
    for name in ("val", "test"):
        check_labels(labels_str["train"], labels_str[name], name)
    labels = LabelVocab.build(labels_str["train"])
    train_lengths = tokenizer.lengths(texts["train"])
    cap = min(dcfg.max_truncate_len, encoder.cfg.context)
    max_len = min(dcfg.truncate_len, cap) or choose_max_len(train_lengths, dcfg.len_percentile, cap)
    cfg = BertConfig(**{**to_dict(encoder.cfg), "dropout": dcfg.dropout})
    seed_everything(tcfg.seed)
    model = BertClassifier(cfg, len(labels), dcfg.pooling)
    if not dcfg.from_scratch:
        model.bert.load_state_dict(encoder.state_dict())
    report = {
        "source": corpus.source,
        "corpus_stats": corpus.stats,
        "checkpoint": str(checkpoint),
        "init": "random (from_scratch)" if dcfg.from_scratch else "pretrained",
        "notes": notes,
        "split_sizes": {name: len(idx) for name, idx in split.items()},
        "label_counts": {name: dict(sorted(Counter(v).items())) for name, v in labels_str.items()},
        "vocab_size": tokenizer.vocab_size,
        "max_len": max_len,
        "truncation": str(truncation_report(train_lengths, max_len)),
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "task": TASK,
        "data": to_dict(dcfg),
        "train": to_dict(tcfg),
        "model": to_dict(cfg),
        "n_classes": len(labels),
    }
    write_json(run_dir / "config.json", config)
    tokenizer.save(run_dir / "tokenizer.json")
    labels.save(run_dir / "labels.json")
    save_split(split_path, split, corpus.texts)
    write_json(run_dir / "data_report.json", report)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"data: {corpus.source}; {report['split_sizes']}; max_len {max_len} "
        f"({report['truncation']})\nmodel: BERT {cfg.n_layers} layers, d_model {cfg.d_model}, "
        f"{n_params / 1e6:.1f}M parameters, {report['init']} from {checkpoint}",
        file=sys.stderr,
    )
    ids = {name: labels.encode(v) for name, v in labels_str.items()}
    train_data = _dataset(
        texts["train"], ids["train"], tokenizer, max_len, tcfg.batch_size, True, tcfg.seed
    )
    val_data = _dataset(
        texts["val"], ids["val"], tokenizer, max_len, dcfg.eval_batch_size, False, 0
    )
    trainer = Trainer(
        model,
        tcfg,
        run_dir,
        train_data,
        step_fn(dcfg.label_smoothing),
        evaluate=evaluator(val_data, labels, device),
        device=device,
    )
    summary = trainer.fit(resume=resume)
    load_weights(model, run_dir / "model.safetensors")
    model.to(device)
    results: dict[str, Any] = {"summary": summary, "n_params": n_params}
    for name in ("val", "test"):
        if split[name]:
            data = _dataset(
                texts[name], ids[name], tokenizer, max_len, dcfg.eval_batch_size, False, 0
            )
            y_true, y_pred, loss = predict_dataset(model, data, device)  # type: ignore[arg-type]
            results[name] = {**classification_report(y_true, y_pred, labels.labels), "loss": loss}
    if "test" in results:
        (run_dir / "test_report.txt").write_text(format_report(results["test"]) + "\n")
    write_json(run_dir / "results.json", results)
    return results


# ---------------------------------------------------------------------------- a trained run


def is_bert_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a fine-tuned BERT classifier (for predict/eval dispatch)."""
    path = Path(run_dir) / "config.json"
    return path.is_file() and json.loads(path.read_text(encoding="utf-8")).get("task") == TASK


@dataclass
class BertClassifierRun:
    """A fine-tuned BERT run directory loaded for inference."""

    run_dir: Path
    data: BertClassifyConfig
    model: BertClassifier
    tokenizer: WordPieceTokenizer
    labels: LabelVocab
    max_len: int

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "cpu") -> BertClassifierRun:
        run_dir = Path(run_dir)
        if not is_bert_run(run_dir):
            raise ValueError(f"{run_dir} does not hold a fine-tuned BERT classifier run")
        if not (run_dir / "model.safetensors").exists():
            raise ValueError(f"{run_dir} has no model.safetensors yet; resume it with --resume")
        raw = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
        dcfg = from_dict(BertClassifyConfig, raw["data"])
        model = BertClassifier(from_dict(BertConfig, raw["model"]), raw["n_classes"], dcfg.pooling)
        load_weights(model, run_dir / "model.safetensors")
        model.to(device).eval()
        max_len = json.loads((run_dir / "data_report.json").read_text())["max_len"]
        tokenizer = WordPieceTokenizer.load(run_dir / "tokenizer.json")
        return cls(
            run_dir, dcfg, model, tokenizer, LabelVocab.load(run_dir / "labels.json"), max_len
        )

    def dataset(self, texts: list[str], labels: list[str]) -> ClassificationData:
        """Evaluation data for texts with known labels."""
        encoded = self.labels.encode(labels)
        batch = self.data.eval_batch_size
        return _dataset(texts, encoded, self.tokenizer, self.max_len, batch, False, 0)

    @torch.no_grad()
    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """Label and per-class probabilities for each text (the classifier run's format)."""
        for i, text in enumerate(texts):
            if not text.strip():
                raise ValueError(f"text {i + 1} is empty; give some words to classify")
        from attnlab.data import pad_batch

        seqs = self.tokenizer.encode_batch(texts, self.max_len)
        ids, lengths = pad_batch(seqs, self.tokenizer.pad_id)
        probs = torch.softmax(self.model(ids, lengths), dim=-1)  # (B, C)
        return [
            {
                "text": text,
                "label": self.labels.labels[int(p.argmax())],
                "probs": {label: float(p[i]) for i, label in enumerate(self.labels.labels)},
            }
            for text, p in zip(texts, probs)
        ]


def evaluate_run(
    run_dir: str | Path,
    data: str | None = None,
    split: str = "test",
    text_col: str | None = None,
    label_col: str | None = None,
) -> dict:
    """`attnlab eval` for a BERT run: its own split (by default test) or a labelled file."""
    run = BertClassifierRun.load(run_dir)
    if data is None:
        corpus = load_corpus(run.data)
        indices = load_split(Path(run_dir) / "split.json", corpus.texts)[split]
        if not indices:
            raise ValueError(f"the run's {split} split is empty; pass --data FILE to evaluate on")
        texts = [corpus.texts[i] for i in indices]
        labels = [corpus.labels[i] for i in indices]
        source = f"{corpus.source} ({split} split)"
    else:
        corpus = load_labeled_file(
            data, text_col or run.data.text_col, label_col or run.data.label_col
        )
        check_labels(run.labels.labels, corpus.labels, data, corpus.origins)
        texts, labels, source = corpus.texts, corpus.labels, str(data)
    y_true, y_pred, loss = predict_dataset(run.model, run.dataset(texts, labels))  # type: ignore[arg-type]
    report = classification_report(y_true, y_pred, run.labels.labels)
    return {**report, "loss": loss, "source": source}
