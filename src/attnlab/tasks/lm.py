"""Language modelling end to end: corpus, tokenizer, GPT training, and text generation.

A run directory holds: config.json (data, model and training configs), tokenizer.json,
data/{train,val}.bin (token ids, memory-mapped), data_report.json, model.safetensors (best by
validation loss), metrics.jsonl, tensorboard/, curves.png, state/ (exact resume),
summary.json, results.json and sample.txt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
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
from attnlab.infer.generation import Generation, check_sampling, sample_next
from attnlab.infer.speculative import Drafter, speculative_decode
from attnlab.interop.hf_gpt2 import load_hf_gpt2
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.runs import training
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.task import Run, RunConfig, Setup, Task
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


# ---------------------------------------------------------------------------- generation


def default_prompt(tokenizer: LMTokenizer) -> str:
    """A neutral start: <|endoftext|> for BPE (GPT-2's convention), else a newline."""
    if isinstance(tokenizer, BPETokenizer):
        return "<|endoftext|>"
    return "\n" if "\n" in getattr(tokenizer, "chars", ()) else tokenizer.decode([0])


def encode_prompt(tokenizer: LMTokenizer, prompt: str, context: int) -> tuple[list[int], int]:
    """Prompt ids, cropped to the last ``context`` tokens; also how many were dropped."""
    if not prompt:
        raise UserError("the prompt is empty; give some text (or leave --prompt out)")
    ids = tokenizer.encode(prompt)
    dropped = max(0, len(ids) - context)
    return ids[dropped:], dropped


@dataclass
class Generated:
    """The prompt as the model saw it and the text generated for each sample."""

    prompt: str
    texts: list[str]
    dropped: int  # prompt tokens cropped away to fit the context
    new_tokens: int  # tokens generated, all samples together
    speculative: dict[str, float] | None = None  # speculative decoding's statistics


class _StopText:
    """Incremental text of one sample: holds back what could still become a stop string."""

    def __init__(self, tokenizer: LMTokenizer, stops: list[str]) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.ids: list[int] = []
        self.emitted = 0  # characters already handed out
        self.done = False

    def add(self, token: int) -> str:
        """Take one token; return newly final text (stopping at a stop string)."""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # a UTF-8 character cut in the middle: wait for its rest
            return ""
        hits = [i for i in (text.find(s, max(0, self.emitted - self.hold)) for s in self.stops)]
        hits = [i for i in hits if i >= 0]
        if hits:
            self.done = True
            return self._emit(text, min(hits))
        return self._emit(text, len(text) - self.hold)

    def flush(self) -> str:
        """The held-back tail once generation ends without a stop string."""
        return self._emit(self.tokenizer.decode(self.ids), None)

    def _emit(self, text: str, end: int | None) -> str:
        end = len(text) if end is None else end
        new = text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return new


def check_request(
    max_new_tokens: int, num_samples: int, temperature: float, top_k: int, top_p: float
) -> None:
    """Reject generation settings that mean nothing, before anything is printed."""
    check_sampling(temperature, top_k, top_p)
    if temperature == 0 and (top_k, top_p) != (0, 1.0):
        given = f"--top-k {top_k}" if top_k else f"--top-p {top_p}"
        raise UserError(
            f"{given} would be ignored: --temperature 0 is greedy decoding (always the most "
            "likely token); drop it, or give a temperature above 0 to sample"
        )
    if max_new_tokens < 1 or num_samples < 1:
        raise UserError(
            f"--max-new-tokens and --num-samples must be >= 1, got {max_new_tokens}, {num_samples}"
        )


def generate_text(
    model: GPT,
    tokenizer: LMTokenizer,
    prompt: str,
    max_new_tokens: int,
    *,
    temperature: float = 0.8,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    num_samples: int = 1,
    stops: list[str] | None = None,
    use_cache: bool = True,
    on_text: Callable[[int, str], None] | None = None,
    device: str = "cpu",
    drafter: Drafter | None = None,
    lookahead: int = 4,
    kv_cache: str = "float",
) -> Generated:
    """Continue ``prompt`` ``num_samples`` times; ``on_text(sample, text)`` streams new text.

    A sample ends after ``max_new_tokens`` tokens or just before its first stop string.
    With ``drafter`` (one sample) decoding is speculative (attnlab.infer.speculative): the
    same distribution, several tokens per pass of the model.
    """
    check_request(max_new_tokens, num_samples, temperature, top_k, top_p)
    stops = [s for s in (stops or []) if s]
    ids, dropped = encode_prompt(tokenizer, prompt, model.cfg.context)
    if drafter is not None:
        return _generate_speculative(
            model, tokenizer, ids, dropped, max_new_tokens, drafter, lookahead,
            (temperature, top_k, top_p), seed, stops, num_samples, on_text, device, kv_cache,
        )  # fmt: skip
    batch = torch.tensor([ids] * num_samples, dtype=torch.long, device=device)  # (N, T)
    gen = Generation(model.eval(), batch, use_cache, kv_cache)
    rng = torch.Generator(device=device).manual_seed(seed)
    streams = [_StopText(tokenizer, stops) for _ in range(num_samples)]
    pieces: list[list[str]] = [[] for _ in range(num_samples)]
    active = list(range(num_samples))  # sample index of each row of `gen`
    new_tokens = 0

    def emit(sample: int, text: str) -> None:
        if text:
            pieces[sample].append(text)
            if on_text is not None:
                on_text(sample, text)

    for _ in range(max_new_tokens):
        tokens = sample_next(gen.next_logits(), temperature, top_k, top_p, rng)  # (rows,)
        gen.append(tokens)
        new_tokens += len(active)
        for sample, token in zip(active, tokens.tolist()):
            emit(sample, streams[sample].add(token))
        rows = [r for r, s in enumerate(active) if not streams[s].done]
        if len(rows) < len(active):
            if not rows:
                break
            gen.keep(torch.tensor(rows, device=device))
            active = [active[r] for r in rows]
    for sample in active:
        if not streams[sample].done:
            emit(sample, streams[sample].flush())
    return Generated(tokenizer.decode(ids), ["".join(p) for p in pieces], dropped, new_tokens)


def _generate_speculative(
    model: GPT,
    tokenizer: LMTokenizer,
    ids: list[int],
    dropped: int,
    max_new_tokens: int,
    drafter: Drafter,
    lookahead: int,
    sampling: tuple[float, int, float],
    seed: int,
    stops: list[str],
    num_samples: int,
    on_text: Callable[[int, str], None] | None,
    device: str,
    kv_cache: str,
) -> Generated:
    """generate_text's speculative path: one sample, streamed, statistics in ``speculative``."""
    if num_samples != 1:
        raise UserError(f"speculative decoding makes one sample at a time, got {num_samples}")
    stream, pieces = _StopText(tokenizer, stops), []

    def on_token(token: int) -> bool:
        text = stream.add(token)
        if text:
            pieces.append(text)
            if on_text is not None:
                on_text(0, text)
        return stream.done

    temperature, top_k, top_p = sampling
    tokens, stats = speculative_decode(
        model.eval(),
        torch.tensor([ids], dtype=torch.long, device=device),
        max_new_tokens,
        drafter,
        lookahead,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        generator=torch.Generator(device=device).manual_seed(seed),
        on_token=on_token,
        kv_cache=kv_cache,
    )
    if not stream.done:
        text = stream.flush()
        if text:
            pieces.append(text)
            if on_text is not None:
                on_text(0, text)
    out = Generated(tokenizer.decode(ids), ["".join(pieces)], dropped, len(tokens))
    out.speculative = stats.as_dict()
    return out


# ---------------------------------------------------------------------------- a trained run


class LMRun(Run):
    """A trained model and its tokenizer: an attnlab run, or a Hugging Face GPT-2 directory."""

    verbs = ("generate",)
    explore_page = "gpt"

    def __init__(
        self,
        model: GPT,
        tokenizer: LMTokenizer,
        source: str,
        run_dir: Path | None = None,
        config: RunConfig | None = None,
    ) -> None:
        super().__init__(run_dir or Path("."), config or RunConfig(TASK.name, {}))
        self.model, self.tokenizer, self.source = model, tokenizer, source

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "cpu") -> LMRun:
        """An `attnlab train lm` run, or a Hugging Face GPT-2 directory (model_type gpt2)."""
        from attnlab.runs.load import load_run_of

        run_dir = Path(run_dir)
        config_path = run_dir / "config.json"
        if config_path.is_file():
            raw = read_json(config_path, "config")
            if isinstance(raw, dict) and raw.get("model_type") == "gpt2":
                model = load_hf_gpt2(run_dir).to(device)
                run = cls(model, _hf_tokenizer(run_dir, raw), "hf-gpt2", run_dir)
                run.device = torch.device(device)
                return run
        return load_run_of(run_dir, cls, "a language model", device)  # type: ignore[return-value]

    def generate(self, prompt: str, max_new_tokens: int, **settings: Any) -> Generated:
        """Continue ``prompt``; ``settings`` are generate_text's keywords (on the run's device
        unless ``device`` says otherwise)."""
        settings.setdefault("device", str(self.device))
        return generate_text(self.model, self.tokenizer, prompt, max_new_tokens, **settings)


def _hf_tokenizer(directory: Path, config: dict) -> LMTokenizer:
    """The tokenizer of a Hugging Face GPT-2 directory: its tokenizer.json, else GPT-2's own."""
    from tokenizers import Tokenizer

    if (directory / "tokenizer.json").exists():
        return BPETokenizer(Tokenizer.from_file(str(directory / "tokenizer.json")), "bpe")
    if config["vocab_size"] == 50257:
        return BPETokenizer.gpt2()
    raise UserError(
        f"{directory} has no tokenizer.json and a vocabulary of {config['vocab_size']} tokens, "
        "not GPT-2's 50257; save the tokenizer with the model (tokenizer.save_pretrained)"
    )


TASK = LMTask()
