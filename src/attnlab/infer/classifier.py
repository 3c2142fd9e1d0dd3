"""A trained text classifier, loaded for use: predict, evaluate, attention.

One run class serves every classifier `attnlab train classify` makes — a fine-tuned pretrained
encoder (``BertClassifier``: e5, MiniLM, a checkpoint folder) or the character model
(``TextClassifier`` or an ensemble of them). What differs between them is how they read text
(the run's :mod:`~attnlab.data.readers` reader) and is decided when the run is loaded; every
verb below reads through it, so ``predict``, ``eval``, the heatmaps, the explorer, the Python
API and the server see a text the same way.

Both models map ids (B, T) right-padded to lengths (B,) to logits (B, C) and have ``inspect``
(logits, attention (L, B, H, T, T), each token's rollout share of the pooled vector).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.data import CharTokenizer, LabelVocab, pad_batch
from attnlab.data.classification import ClassificationData
from attnlab.data.io import is_blank, read_json
from attnlab.data.readers import CharReader, PieceReader, Reader, dataset
from attnlab.data.sentencepiece import load_tokenizer
from attnlab.data.sentiment import (
    TUTORIAL_EXAMPLES,
    TWO_CLASSES,
    load_corpus,
    load_ood,
    ood_files,
)
from attnlab.data.splits import check_labels, load_split
from attnlab.data.tabular import load_labeled_file
from attnlab.errors import UserError
from attnlab.infer.precision import (
    CHECK_TEXTS,
    PRECISIONS,
    Choice,
    available,
    choose,
    compile_missing,
    compiled,
    convert,
)
from attnlab.metrics import classification_report
from attnlab.models.bert import BertClassifier, BertConfig
from attnlab.models.classifier import build_classifier
from attnlab.models.zoo_mlm import encoder_classifier
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.task import Run, RunConfig
from attnlab.tensor_files import tensors_sha256
from attnlab.train import load_weights


def batch_logits(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """Class logits (B, C) of a collated batch: token ids, or the kept output of a frozen
    encoder's lower blocks (:class:`~attnlab.data.states.StateData`)."""
    if "hidden" in batch:
        return model(None, batch["lengths"], hidden=batch["hidden"], start=batch["start"])
    return model(batch["input_ids"], batch["lengths"])


@torch.no_grad()
def predict_dataset(
    model: torch.nn.Module, data: Any, device: torch.device | str = "cpu"
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
        loss_sum += F.cross_entropy(logits.float(), batch["labels"], reduction="sum").item()
        order += list(indices)
        preds += logits.argmax(-1).tolist()
    model.train(was_training)
    pred_by_index = dict(zip(order, preds))
    y_pred = [pred_by_index[i] for i in range(len(data))]
    return list(data.labels), y_pred, loss_sum / max(len(data), 1)


def report_of(model: torch.nn.Module, data: Any, labels: LabelVocab, device: Any) -> dict:
    """classification_report of ``data`` plus its mean cross-entropy ``loss``."""
    y_true, y_pred, loss = predict_dataset(model, data, device)
    return {**classification_report(y_true, y_pred, labels.labels), "loss": loss}


class SplitScorer:
    """The engine's validation metrics (val_loss, val_acc, val_macro_f1) on one split, and
    the split's whole report for the run's results; with ``extra`` ({name: dataset}) the same
    three metrics of each extra set too (``ood_dev_acc`` ...), which a run may monitor.

    The last report is kept with the SHA-256 of the weights it scored: the best checkpoint
    the run reloads before its final reports is the weights of its last best evaluation, so
    that split is not run through the model a second time.
    """

    def __init__(
        self, data: Any, labels: LabelVocab, device: Any, extra: Mapping[str, Any] | None = None
    ) -> None:
        self.data, self.labels, self.device = data, labels, device
        self.extra = dict(extra or {})
        self._last: tuple[str, dict[str, Any]] | None = None

    def report(self, model: torch.nn.Module) -> dict[str, Any]:
        key = tensors_sha256(model.state_dict())
        if self._last is not None and self._last[0] == key:
            return dict(self._last[1])
        report = report_of(model, self.data, self.labels, self.device)
        self._last = (key, report)
        return dict(report)

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        metrics = {}
        reports = {"val": self.report(model)}
        reports |= {name: report_of(model, data, self.labels, self.device)
                    for name, data in self.extra.items()}  # fmt: skip
        for name, report in reports.items():
            metrics |= {f"{name}_loss": report["loss"], f"{name}_acc": report["accuracy"],
                        f"{name}_macro_f1": report["macro_f1"]}  # fmt: skip
        return metrics


def ood_dev_data(reader: Reader, labels: LabelVocab, batch_size: int) -> Any:
    """The bundled out-of-domain dev set as a dataset (``ood_dev`` for a :class:`SplitScorer`),
    for a run that chooses its checkpoint on it; the test set stays unread."""
    files = ood_files()
    if "dev" not in files or set(labels.labels) != TWO_CLASSES:
        raise UserError(
            "--monitor ood_dev_* reads the bundled out-of-domain dev set, which scores "
            f"positive/negative only; these labels are {labels.labels}: monitor val_acc"
        )
    corpus, _ = load_ood("dev")
    return dataset(reader, corpus.texts, labels.encode(corpus.labels), batch_size)


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


def evaluate_ood(
    model: torch.nn.Module, reader: Reader, labels: LabelVocab, batch_size: int, device: Any
) -> dict[str, dict] | None:
    """Reports on the bundled out-of-domain sets (dev, test), per domain and phenomenon; None
    for label sets other than positive/negative."""
    files = ood_files()
    if not files or set(labels.labels) != TWO_CLASSES:
        return None
    out = {}
    for name in files:
        corpus, tags = load_ood(name)
        data = dataset(reader, corpus.texts, labels.encode(corpus.labels), batch_size)
        y_true, y_pred, loss = predict_dataset(model, data, device)
        report = classification_report(y_true, y_pred, labels.labels)
        out[name] = {**report, "loss": loss, "accuracy_by": accuracy_by_tag(y_true, y_pred, tags)}
    return out


def draw_heatmaps(info: dict[str, Any], text: str, path: Path, note: str) -> list[str]:
    """Every layer × head of ``info`` (a run's ``attention``) drawn to ``path``; the summary
    lines: the prediction, the five tokens with the largest ``token_share``."""
    from attnlab.viz import plot_attention_grid

    title = f"{text}  →  {info['label']} ({info['prob']:.2f}){note}"
    plot_attention_grid(
        info["attention"], info["tokens"], path, token_share=info["token_share"], title=title
    )
    top = sorted(zip(info["tokens"], info["token_share"].tolist()), key=lambda t: -t[1])[:5]
    leans = ", ".join(f"{tok} {value:.2f}" for tok, value in top)
    summary = f"{info['label']} ({info['prob']:.3f}); leans on: {leans}"
    return [summary, f"heatmaps written to {path}"]


class ClassifierRun(Run):
    """A trained classifier: predict, evaluate, attention."""

    verbs = ("predict", "evaluate", "attention")

    def __init__(
        self,
        run_dir: Path,
        config: RunConfig,
        model: torch.nn.Module,
        reader: Reader,
        labels: LabelVocab,
        explore_page: str,
        train_len: int | None = None,
    ) -> None:
        super().__init__(run_dir, config)
        self.model, self.reader, self.labels = model, reader, labels
        self.explore_page = explore_page  # type: ignore[misc]  # "classifier" or "bert"
        # ids of a text training read at most (data_report's max_len); predict may read more
        self.train_len = train_len or reader.max_len
        self.infer_model = model  # what predict runs: the model, or a faster path of it
        self.precision = Choice("fp32", 1, "fp32: the trained model")

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "cpu") -> ClassifierRun:
        """The classifier run in ``run_dir`` (a UserError for any other kind of run)."""
        from attnlab.runs.load import load_run_of

        return load_run_of(run_dir, cls, "a classifier", device)  # type: ignore[return-value]

    @property
    def tokenizer(self) -> Any:
        return self.reader.tokenizer

    @property
    def max_len(self) -> int:
        """Ids the model reads of a text at most (specials included)."""
        return self.reader.max_len

    @property
    def members(self) -> int:
        """Models in the run: an ensemble's members, else 1."""
        return len(getattr(self.model, "members", [self.model]))

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Texts -> padded ids (B, T) and lengths (B,); an empty text is an error."""
        for i, text in enumerate(texts):
            if is_blank(text):
                raise UserError(f"text {i + 1} is empty; give some words to classify")
        return pad_batch(self.reader.encode_batch(texts), self.reader.pad_id)

    @torch.no_grad()
    def probs(self, model: torch.nn.Module, texts: list[str]) -> torch.Tensor:
        """Class probabilities (N, C) of ``texts`` through ``model`` (a path of the run's)."""
        ids, lengths = self.encode(texts)
        return torch.softmax(model(ids.to(self.device), lengths.to(self.device)).float(), -1)

    def use_precision(self, precision: str, threads: list[int], compile: bool = False) -> Choice:
        """Take the ``precision`` path for predict ("auto": the fastest whose labels equal
        float32's on the check set, timed on each of ``threads``; attnlab.infer.precision);
        ``compile``: then run it through ``torch.compile`` (fp32 or bf16), compiled here on
        the check set rather than on the first texts to predict."""
        if precision not in PRECISIONS:
            raise UserError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
        if precision not in ("auto", *available()):
            raise UserError(f"precision {precision}: this CPU has no native bfloat16 "
                            "(avx512_bf16 or AMX); use int8, fp32 or auto")  # fmt: skip
        if torch.device(self.device).type != "cpu" and precision != "fp32":
            raise UserError(f"precision {precision} is a CPU path; on {self.device} use fp32")
        if compile:
            if torch.device(self.device).type != "cpu":
                raise UserError(f"--compile compiles the CPU paths; on {self.device} drop it")
            if precision == "int8":
                raise UserError("--compile compiles the fp32 and bf16 paths, not int8's "
                                "quantized layers: drop --compile or give "
                                "--precision bf16")  # fmt: skip
            missing = compile_missing()
            if missing:
                raise UserError(f"--compile: {missing}; install one or drop --compile")
        if precision == "auto" or len(threads) > 1:
            paths = available() if precision == "auto" else (precision,)
            if compile:
                paths = tuple(p for p in paths if p != "int8")
            choice, models = choose(self.model, self.probs, check_set(), paths, threads)
            self.infer_model = models[choice.precision]
        else:
            self.infer_model = convert(self.model, precision)
            said = "the trained model" if precision == "fp32" else "not checked"
            choice = Choice(precision, threads[0], f"{precision} as asked ({said})")
        if compile:
            start = time.perf_counter()
            self.infer_model = compiled(self.infer_model, self.model)
            # compiled now, on the threads predict runs on: the graph is kept for that count;
            # and at the widest batch predict reads, where attention may take another kernel
            before = torch.get_num_threads()
            torch.set_num_threads(choice.threads or before)
            try:
                self.probs(self.infer_model, check_set())
                self.probs(self.infer_model, ["".join(check_set() * 16)])  # cut at the widest
            finally:
                torch.set_num_threads(before)
            choice.compiled = True
            choice.reason += (f"; compiled with torch.compile in "
                              f"{time.perf_counter() - start:.0f} s")  # fmt: skip
        self.precision = choice
        return choice

    @torch.no_grad()
    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """For each text: the label, the probability of each class, the share of its tokens
        the model reads as unknown (``unknown_share``, ``out_of_reach``: data/coverage.py),
        whether it was longer than the model reads (``truncated``, with its length in
        ``tokens``, against ``max_len``) and whether it was longer than training read
        (``longer_than_training``, against ``train_len``: a run may read more at predict
        than it trained on, and the model never saw positions past ``train_len``)."""
        ids, lengths = self.encode(texts)
        logits = self.infer_model(ids.to(self.device), lengths.to(self.device))  # (B, C)
        probs = torch.softmax(logits.float(), dim=-1).cpu()  # (B, C)
        full = self.reader.lengths(texts)
        names = self.labels.labels
        out = []
        for text, p, row, n, m in zip(texts, probs, ids.tolist(), lengths.tolist(), full):
            out.append(
                {
                    "text": text,
                    "label": names[int(p.argmax())],
                    "probs": {label: float(p[i]) for i, label in enumerate(names)},
                    "truncated": m > n,
                    "longer_than_training": m > self.train_len,
                    "tokens": m,
                    **self.reader.reach(row[:n]),
                }
            )
        return out

    @torch.no_grad()
    def attention(self, text: str, member: int = 0) -> dict[str, Any]:
        """Tokens, attention (L, H, T, T), each token's share of the pooled vector and the
        prediction for one text; for an ensemble, member ``member``'s attention with the
        ensemble's prediction."""
        ids, lengths = self.encode([text])
        ids, lengths = ids.to(self.device), lengths.to(self.device)
        if self.members > 1:
            info = self.model.inspect(ids, lengths, member)
        elif member != 0:
            raise UserError(f"{self.run_dir} holds a single model, not an ensemble: only member 1")
        else:
            info = self.model.inspect(ids, lengths)
        probs = torch.softmax(info["logits"][0].float(), -1)
        k = int(probs.argmax())
        return {
            "tokens": self.reader.tokens(text),
            "attention": info["attention"][:, 0].float().cpu(),  # (L, H, T, T)
            "token_share": info["token_share"][0].float().cpu(),  # (T,)
            "label": self.labels.labels[k],
            "prob": float(probs[k]),
        }

    def draw_attention(self, text: str, out: str | None, member: int = 1) -> list[str]:
        """Heatmaps of every layer × head for ``text`` (member 1..M of an ensemble)."""
        if not 1 <= member <= self.members:
            raise UserError(
                f"--member {member}: this run has {self.members} member(s), give 1..{self.members}"
            )
        info = self.attention(text, member=member - 1)
        note = f"  [attention of member {member} of {self.members}]" if self.members > 1 else ""
        return draw_heatmaps(info, text, Path(out) if out else self.run_dir / "attention.png", note)

    def dataset(self, texts: list[str], labels: list[str]) -> ClassificationData:
        """Evaluation data of texts with known labels, read as ``predict`` reads them."""
        batch = self.config.data.eval_batch_size
        return dataset(self.reader, texts, self.labels.encode(labels), batch)

    def split_texts(self, split: str) -> tuple[list[str], list[str], str]:
        """(texts, labels, source) of one of the run's own splits (rebuilt from split.json)."""
        d = self.config.data
        corpus, _ = load_corpus(
            d.data, d.text_col, d.label_col, d.val_data, d.test_data, d.max_examples, d.split_seed
        )
        indices = load_split(self.run_dir / "split.json", corpus.texts)[split]
        if not indices:
            raise UserError(f"the run's {split} split is empty; pass --data FILE to evaluate on")
        texts = [corpus.texts[i] for i in indices]
        return texts, [corpus.labels[i] for i in indices], f"{corpus.source} ({split} split)"

    def evaluate(
        self,
        data: str | None = None,
        split: str = "test",
        text_col: str | None = None,
        label_col: str | None = None,
    ) -> dict[str, Any]:
        """Accuracy, macro-F1, per-class report and confusion matrix on the run's own split
        (by default test) or on a labelled file with the same classes."""
        if data is None:
            texts, labels, source = self.split_texts(split)
        else:
            d = self.config.data
            corpus = load_labeled_file(data, text_col or d.text_col, label_col or d.label_col)
            check_labels(self.labels.labels, corpus.labels, data, corpus.origins)
            texts, labels, source = corpus.texts, corpus.labels, str(data)
        report = report_of(self.model, self.dataset(texts, labels), self.labels, self.device)
        return {**report, "source": source}


def load_classifier(run_dir: Path, cfg: RunConfig, device: str) -> ClassifierRun:
    """The classifier of a classify run folder: a pretrained encoder's (the model section is
    the encoder's ``BertConfig``) or the character model's, with the reader it trained with."""
    labels = LabelVocab.load(run_dir / "labels.json")
    report = read_json(run_dir / "data_report.json", "data report", keys={"max_len": int})
    model: torch.nn.Module
    if isinstance(cfg.model, BertConfig):
        encoder = report.get("encoder", {})
        model = encoder_classifier(cfg.model, len(labels), cfg.data.pooling,
                                   encoder.get("family", "bert"),
                                   encoder.get("embedding_size", 0))  # fmt: skip
        tokenizer = load_tokenizer(run_dir / "tokenizer.json")
        reader: Reader = PieceReader(tokenizer, report.get("read_len", report["max_len"]))
    else:
        if cfg.model.n_classes != len(labels):
            raise UserError(
                f"{run_dir / 'labels.json'} names {len(labels)} labels but the model has "
                f"{cfg.model.n_classes} classes; restore the run's labels.json"
            )
        model = build_classifier(cfg.model)
        reader = CharReader(CharTokenizer.load(run_dir / "tokenizer.json"), report["max_len"],
                            cfg.model.pooling == "cls", cfg.data.tail_share)  # fmt: skip
    load_weights(model, run_dir / WEIGHTS)
    model.to(device).eval()
    page = "bert" if isinstance(model, BertClassifier) else "classifier"
    return ClassifierRun(run_dir, cfg, model, reader, labels, page, report["max_len"])


def check_set() -> list[str]:
    """The texts a fast path's labels are checked on against float32's (and timed on):
    every third review of the bundled out-of-domain dev set (films, series, restaurants,
    hotels, games, apps), or the tutorial's sentences where that set is not installed."""
    files = ood_files()
    if "dev" not in files:
        return [t for t, _ in TUTORIAL_EXAMPLES]
    corpus, _ = load_ood("dev")
    return corpus.texts[::3][:CHECK_TEXTS]


def result_lines(results: Mapping[str, Any], run: ClassifierRun) -> list[str]:
    """What a finished classifier run prints: test, out-of-domain and the tutorial's examples
    (``run`` predicts them; they are only for positive/negative labels)."""
    lines = []
    test = results.get("test")
    if test is not None:
        lines.append(f"test accuracy {test['accuracy']:.4f}, macro-F1 {test['macro_f1']:.4f} "
                     f"(n = {test['n']})")  # fmt: skip
    for name, report in (results.get("ood") or {}).items():
        lines.append(
            f"out-of-domain {name} accuracy {report['accuracy']:.4f}, macro-F1 "
            f"{report['macro_f1']:.4f} (n = {report['n']}; films, series, restaurants, hotels, "
            "games, apps)"
        )
    if set(run.labels.labels) == TWO_CLASSES:
        lines.append("tutorial examples:")
        texts = [t for t, _ in TUTORIAL_EXAMPLES]
        for pred, (_, want) in zip(run.predict(texts), TUTORIAL_EXAMPLES):
            mark = "ok" if pred["label"] == want else f"WRONG (expected {want})"
            prob = pred["probs"][pred["label"]]
            lines.append(f"  {pred['text']} -> {pred['label']} {prob:.3f}  {mark}")
    return lines
