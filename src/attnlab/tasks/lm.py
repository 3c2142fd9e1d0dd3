"""Language modelling end to end: corpus, tokenizer and GPT training; generation is
:mod:`attnlab.infer.lm`.

A run directory holds: config.json (data, model and training configs), tokenizer.json,
data/{train,val}.bin (token ids, memory-mapped), data_report.json, model.safetensors (best by
validation loss), metrics.jsonl, tensorboard/, curves.png, state/ (exact resume),
summary.json, results.json and sample.txt.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.configs import ConfigBase, setting
from attnlab.data.bpe import BPETokenizer
from attnlab.data.io import read_json, write_json
from attnlab.data.lm_tokenizer import (
    CharLMTokenizer,
    LMTokenizer,
    load_tokenizer,
    save_tokenizer,
)
from attnlab.data.text_lm import (
    LMData,
    corpus_files,
    eval_starts,
    iter_split,
    open_tokens,
    write_tokens,
)
from attnlab.errors import UserError
from attnlab.infer.lm import LMRun, default_prompt, generate_text
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.runs import training
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.task import RunConfig, Setup, Task
from attnlab.train import StepOutput, TrainConfig, load_weights


@dataclass
class LMDataConfig(ConfigBase):
    """Corpus, tokenizer and evaluation options of the language-model task."""

    data: str = setting("", "UTF-8 file or folder; empty = Shakespeare")
    tokenizer: Literal["char", "gpt2", "bpe"] = setting("char", "char | gpt2 | bpe (trained here)")
    bpe_vocab_size: int = setting(4096, "vocabulary of tokenizer=bpe")
    val_fraction: float = setting(0.1, "tail of every file kept for validation", above=0, below=1)
    eval_windows: int = setting(200, "evenly spaced validation windows per eval; 0 = all", min=0)
    eval_batch_size: int = setting(32, min=1)
    epoch_windows: int = setting(0, "training windows per epoch; 0 = train tokens / context", min=0)
    sample_tokens: int = setting(300, "tokens sampled after training (0 = none)", min=0)


SECTIONS: dict[str, type[ConfigBase]] = {
    "data": LMDataConfig,
    "model": GPTConfig,
    "train": TrainConfig,
}


def build_config(preset: str | Path | None, overrides: dict[str, Any]) -> RunConfig:
    """Defaults <- presets/lm.toml <- a preset (file or bundled name) <- command-line fields."""
    return training.build_config(TASK, preset, overrides)


# ---------------------------------------------------------------------------- data


def build_tokenizer(dcfg: LMDataConfig, files: list[Path]) -> LMTokenizer:
    """The run's tokenizer: the corpus alphabet, GPT-2's BPE, or BPE trained on the train split."""
    if dcfg.tokenizer == "char":  # every character of the corpus, as nanoGPT does
        return CharLMTokenizer.build(
            chunk
            for split in ("train", "val")
            for chunk in iter_split(files, split, dcfg.val_fraction)
        )
    if dcfg.tokenizer == "gpt2":
        return BPETokenizer.gpt2()
    return BPETokenizer.train(iter_split(files, "train", dcfg.val_fraction), dcfg.bpe_vocab_size)


@dataclass
class Prepared:
    """The tokenizer and memory-mapped token arrays of a run."""

    tokenizer: LMTokenizer
    train: np.ndarray
    val: np.ndarray
    report: dict[str, Any]


def check_split_sizes(dcfg: LMDataConfig, counts: dict[str, int], context: int) -> None:
    """Refuse a text too short for its splits, with the size it needs: training windows are
    context + 1 tokens plus one start to draw, evaluation windows context + 1 tokens."""
    need = {"train": context + 2, "val": context + 1}
    short = [s for s in ("val", "train") if counts[s] < need[s]]
    if not short:
        return
    split = short[0]
    part = f"the last {dcfg.val_fraction:.0%}" if split == "val" else "the rest"
    where = "for a validation split" if split == "val" else "for training"
    share = dcfg.val_fraction if split == "val" else 1 - dcfg.val_fraction
    source = dcfg.data or "the corpus"
    raise UserError(
        f"{source}: text too short {where}: {part} of it (cut at a line start) holds "
        f"{counts[split]} token(s), and --context {context} needs {need[split]}; give a text "
        f"of about {math.ceil(need[split] / share) + 1} characters or more over several "
        "lines, or lower --context"
    )


def prepare(
    dcfg: LMDataConfig, run_dir: Path, resume: bool, context: int | None = None
) -> Prepared:
    """Build (or, on resume, reopen) the tokenizer and the token files of ``run_dir``;
    ``context`` given: refuse a text too short for training and validation windows."""
    tok_path, data_dir = run_dir / "tokenizer.json", run_dir / "data"
    bins = {split: data_dir / f"{split}.bin" for split in ("train", "val")}
    report_path = run_dir / "data_report.json"
    if resume and tok_path.exists() and report_path.exists():
        tokenizer = load_tokenizer(tok_path)
        report = read_json(report_path, "data report")
    else:
        files = corpus_files(dcfg.data)
        training.say(f"data: {len(files)} file(s) from {dcfg.data or 'the shakespeare package'}")
        tokenizer = build_tokenizer(dcfg, files)
        counts = {
            split: write_tokens(iter_split(files, split, dcfg.val_fraction), tokenizer, path)
            for split, path in bins.items()
        }
        if context is not None:
            check_split_sizes(dcfg, counts, context)
        report = {
            "source": dcfg.data or "shakespeare package, shksprdata/texts/*_gut.txt",
            "files": len(files),
            "bytes": sum(p.stat().st_size for p in files),
            "tokenizer": tokenizer.kind,
            "vocab_size": tokenizer.vocab_size,
            "tokens": counts,
            "split": f"last {dcfg.val_fraction:.0%} of every file (from a line start) is val",
        }
        run_dir.mkdir(parents=True, exist_ok=True)
        save_tokenizer(tokenizer, tok_path)
        write_json(report_path, report)
    train, val = (open_tokens(bins[s], tokenizer.vocab_size) for s in ("train", "val"))
    return Prepared(tokenizer, train, val, report)


# ---------------------------------------------------------------------------- train / evaluate


def lm_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> StepOutput:
    """Mean next-token cross-entropy of one micro-batch (Radford et al. 2018, eq. 1), plus a
    MoE model's auxiliary loss, whose value and expert usage are logged (moe_metrics)."""
    logits = model(batch["input_ids"])  # (B, T, V)
    targets = batch["targets"]  # (B, T)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    gpt = getattr(model, "module", model)  # the GPT inside a DDP wrapper
    if not gpt.moe_layers():
        return StepOutput(loss=loss, weight=targets.numel())
    aux = gpt.aux_loss()
    metrics = {"lm_loss": float(loss.detach()), **moe_metrics(gpt, aux)}
    return StepOutput(loss=loss + aux, weight=targets.numel(), metrics=metrics)


def moe_metrics(gpt: GPT, aux: torch.Tensor) -> dict[str, float]:
    """aux_loss, and per MoE layer i: moe{i}_dropped and each expert's share moe{i}_e{j}."""
    metrics = {"aux_loss": float(aux.detach())}
    for layer in gpt.expert_usage():
        i = layer["layer"]
        metrics[f"moe{i}_dropped"] = layer["dropped"]
        metrics.update({f"moe{i}_e{j}": share for j, share in enumerate(layer["usage"])})
    return metrics


@torch.no_grad()
def mean_loss(
    model: GPT, tokens: np.ndarray, starts: list[int], batch_size: int, device: str = "cpu"
) -> float:
    """Mean next-token cross-entropy over the windows at ``starts`` (nats per token)."""
    was_training = model.training
    model.eval()
    data = LMData(tokens, model.cfg.context, batch_size)
    total, count = 0.0, 0
    for i in range(0, len(starts), batch_size):
        batch = data.collate(starts[i : i + batch_size])
        logits = model(batch["input_ids"].to(device))  # (B, T, V)
        targets = batch["targets"].to(device)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        total += loss.item() * targets.numel()
        count += targets.numel()
    model.train(was_training)
    return total / count


def evaluator(val: np.ndarray, dcfg: LMDataConfig, context: int, device: str):
    """The engine's evaluate(): validation loss on fixed, evenly spaced windows."""
    starts = eval_starts(len(val), context, dcfg.eval_windows)

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        return {"val_loss": mean_loss(model, val, starts, dcfg.eval_batch_size, device)}  # type: ignore[arg-type]

    return evaluate


class LMTask(Task):
    """Next-token language modelling with a GPT."""

    name = "lm"
    preset = "lm"
    preset_prefix = "lm"
    resumable = frozenset({"eval_batch_size", "sample_tokens"})
    data_paths = ("data",)

    def sections(self) -> dict[str, type[ConfigBase]]:
        return SECTIONS

    def check(self, cfg: RunConfig) -> None:
        # A context of one token is a bigram table, not a language model that attends to
        # anything, and its final evaluation runs one forward pass per validation token
        # (about 500,000 on Shakespeare): refused rather than capped, so no run reports a
        # perplexity over a sample of windows it did not say it sampled.
        if cfg.model.context < 2:
            raise UserError(
                f"--context {cfg.model.context}: a language model needs at least 2 tokens of "
                "context (1 leaves attention nothing to attend to); give --context 2 or more"
            )

    def setup(self, cfg: RunConfig, run_dir: Path, resume: bool, device: str) -> Setup:
        prep = prepare(cfg.data, run_dir, resume, cfg.model.context)
        cfg.model.vocab_size = prep.tokenizer.vocab_size
        train_data = LMData(
            prep.train,
            cfg.model.context,
            cfg.train.batch_size,
            cfg.train.seed,
            cfg.data.epoch_windows,
        )
        tokens = prep.report["tokens"]
        message = (
            f"tokens: train {tokens['train']:,}, val {tokens['val']:,} "
            f"({prep.report['tokenizer']}, vocabulary {prep.report['vocab_size']:,}); "
            f"an epoch is {train_data.steps_per_epoch:,} steps of {cfg.train.batch_size} windows"
        )
        evaluate = evaluator(prep.val, cfg.data, cfg.model.context, device)
        return Setup(prep, train_data, evaluate, messages=[message])

    def build_model(self, cfg: RunConfig, setup: Setup) -> GPT:
        model, m = GPT(cfg.model), cfg.model
        setup.messages.append(
            f"model: {model.num_params() / 1e6:.2f}M parameters; {m.n_layers} layers, "
            f"{m.n_heads} heads ({m.kv_heads} kv), d_model {m.d_model}, context {m.context}, "
            f"pos {m.pos}, {m.norm}-norm, {m.activation}; mixer {m.mixer}"
            + (f" (attention every {m.attn_every})" if m.mixer == "hybrid" else "")
            + (
                f", MoE {m.experts} experts top-{m.top_k}, "
                f"{model.active_params() / 1e6:.2f}M active"
                if m.ffn == "moe"
                else ""
            )
        )
        return model

    def step(self, cfg: RunConfig):
        return lm_step

    def finish(
        self, cfg: RunConfig, setup: Setup, model: GPT, run_dir: Path, device: str
    ) -> dict[str, Any]:
        prep: Prepared = setup.prepared
        results: dict[str, Any] = {"n_params": model.num_params()}
        results.update(final_val_loss(model, prep.val, cfg, run_dir, device))
        if cfg.data.sample_tokens:
            sample = generate_text(
                model,
                prep.tokenizer,
                default_prompt(prep.tokenizer),
                cfg.data.sample_tokens,
                seed=cfg.train.seed,
                device=device,
            )
            results["sample"] = sample.texts[0]
            (run_dir / "sample.txt").write_text(sample.prompt + sample.texts[0] + "\n")
        return results

    def describe(self, results: Mapping[str, Any], run_dir: Path) -> list[str]:
        loss = results["val_loss"]
        lines = [f"validation loss {loss:.4f}, perplexity {math.exp(loss):.2f}"]
        if "val_scope" in results:  # runs of older attnlab versions reported the sample alone
            lines[0] += (
                f" ({results['val_scope']}, the best weights); the 'best' above is the "
                f"monitoring sample ({results['monitor_scope']})"
            )
        if "sample" in results:
            lines.append(f"sample:\n{results['sample']}")
        return lines

    def load(self, run_dir: Path, cfg: RunConfig, device: str) -> LMRun:
        model = GPT(cfg.model)
        load_weights(model, run_dir / WEIGHTS)
        tokenizer = load_tokenizer(run_dir / "tokenizer.json")
        return LMRun(model.to(device).eval(), tokenizer, "attnlab", run_dir, cfg)


def mean_loss_of_best(run_dir: Path) -> float:
    """The best validation loss of a run, as the engine recorded it in summary.json (on the
    monitoring sample of ``eval_windows`` windows)."""
    return read_json(run_dir / "summary.json", "summary")["best_metric"]


# The reported val_loss scores every validation window up to this many, else this many evenly
# spaced ones: the cost of a batch hardly depends on its context, so a context of a few tokens
# would otherwise spend minutes on hundreds of thousands of windows (at context 64, Shakespeare's
# validation split is 7,889 windows: all of them).
FINAL_WINDOWS = 10_000


def final_val_loss(
    model: GPT, val: np.ndarray, cfg: RunConfig, run_dir: Path, device: str
) -> dict[str, Any]:
    """The figure a run reports: the best weights' loss on every window of the validation
    split, or FINAL_WINDOWS evenly spaced ones of a split that has more (fp32), beside the
    cheap sample that monitored training (``eval_windows``)."""
    context = cfg.model.context
    every = eval_starts(len(val), context, 0)
    scored, scope = every, f"whole validation split, {len(every):,} windows of {context} tokens"
    if len(every) > FINAL_WINDOWS:
        scored = eval_starts(len(val), context, FINAL_WINDOWS)
        scope = (
            f"{len(scored):,} evenly spaced of the validation split's {len(every):,} windows of "
            f"{context} tokens, at most {FINAL_WINDOWS:,} being scored"
        )
    sample = eval_starts(len(val), context, cfg.data.eval_windows)
    return {
        "val_loss": mean_loss(model, val, scored, cfg.data.eval_batch_size, device),
        "val_scope": scope,
        "monitor_val_loss": mean_loss_of_best(run_dir),
        "monitor_scope": f"{len(sample):,} evenly spaced windows, used to pick the best step",
    }


TASK = LMTask()
