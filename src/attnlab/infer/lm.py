"""Text generation with a trained language model: the prompt, stop strings, ``generate_text``
(sampling or speculative decoding) and ``LMRun``, the loaded run that `attnlab generate` uses
(an `attnlab train lm` run or a Hugging Face GPT-2 directory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab.data.bpe import BPETokenizer
from attnlab.data.io import read_json
from attnlab.data.lm_tokenizer import LMTokenizer
from attnlab.errors import UserError
from attnlab.infer.generation import Generation, check_sampling, sample_next
from attnlab.infer.speculative import Drafter, speculative_decode
from attnlab.interop.hf_gpt2 import load_hf_gpt2
from attnlab.models.gpt import GPT
from attnlab.runs.load import load_run_of
from attnlab.runs.task import Run, RunConfig


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
        # a Hugging Face directory has no attnlab config: it reads as a run of the lm task
        super().__init__(run_dir or Path("."), config or RunConfig("lm", {}))
        self.model, self.tokenizer, self.source = model, tokenizer, source

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "cpu") -> LMRun:
        """An `attnlab train lm` run, or a Hugging Face GPT-2 directory (model_type gpt2)."""
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
