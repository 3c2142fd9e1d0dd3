"""Does ``torch.compile`` make the main job's bf16 step pull ahead of its fp32 step? The trained
blocks' forward and backward, eager against compiled, fp32 against bf16 autocast.

The default (presets/classify.toml) trains the top 4 blocks of multilingual-e5-small over the
kept output of the 8 below, in micro-batches of 16 texts padded to their longest (16 to 128
pieces). docs/results/e5_default_step.md profiles that step: the matmuls run 3.6x faster in
bf16, but the element-wise work around them (dropout, GELU, norms, casts, the attention kernel
kept in float32) runs no faster, so the step gains 1.8x. Fusing element-wise work is what
Inductor (``torch.compile``'s default backend, C++ kernels on the CPU) does; this script
measures whether it pays here.

For each length, 16 random kept states (the values do not change the time; a quarter of the
texts half as long, so the key mask matters) go through blocks 9-12 of the real e5 weights
with dropout 0.1 on the sub-layer outputs and none on the attention weights, as the default
trains them; the loss is the sum of the mean-pooled output; backward to the weights. Cases:
eager and compiled (``torch.compile``, static shapes: one compilation per length, each length
a fresh compile), each in fp32 and under bf16 autocast. The cases alternate, ``--rounds``
times after ``--warmup`` untimed rounds; the median counts. Compilation time is reported
apart (the first call of each precision).

    python -m benchmarks.classify.e5_compile_step [--lengths 32 48 64 128] [--rounds 12]
        -> docs/results/e5_compile_step.{json,md}
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.common import (
    command_line,
    load_average,
    machine,
    machine_line,
    set_threads,
    write_results,
)

STEM = "e5_compile_step"
TRAINED = 4  # blocks the default trains (train_layers)
BATCH = 16  # texts in one of the default's micro-batches
CASES = ("eager fp32", "eager bf16", "compiled fp32", "compiled bf16")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[32, 48, 64, 128])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    return p


def trained_top() -> tuple[Any, int]:
    """e5's encoder with the default's dropout, its top blocks in training mode: (model, the
    index of the first trained block)."""
    from attnlab.models.e5 import load_e5

    model, _ = load_e5(dropout=0.1)
    start = model.cfg.n_layers - TRAINED
    model.requires_grad_(False)
    for block in list(model.encoder.blocks)[start:]:
        block.requires_grad_(True)
        block.self_attn.dropout = 0.0  # attn_dropout = 0 in the preset: the fused kernel runs
    model.train()
    return model, start


def step(model: Any, hidden: Any, lengths: Any, start: int, bf16: bool) -> None:
    """One forward and backward of the trained blocks; gradients dropped afterwards."""
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model.forward_from(hidden, lengths, start)  # (B, T, D)
        keep = (torch.arange(hidden.shape[1])[None, :] < lengths[:, None])[..., None]  # (B,T,1)
        loss = ((out.float() * keep).sum(1) / lengths[:, None]).sum()
    loss.backward()
    for p in model.parameters():
        p.grad = None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    base, start = trained_top()
    rows = {}
    for T in args.lengths:
        torch._dynamo.reset()
        compiled = copy.deepcopy(base)
        for block in list(compiled.encoder.blocks)[start:]:
            block.compile(dynamic=False)
        gen = torch.Generator().manual_seed(T)
        hidden = torch.randn(BATCH, T, base.cfg.d_model, generator=gen)  # (B, T, D)
        lengths = torch.full((BATCH,), T)
        lengths[: BATCH // 4] = T // 2
        models = {"eager": base, "compiled": compiled}

        def run(
            case: str, hidden: Any = hidden, lengths: Any = lengths, models: Any = models
        ) -> None:
            kind, precision = case.split()
            step(models[kind], hidden, lengths, start, precision == "bf16")

        compile_s = {}
        for case in CASES:
            began = time.perf_counter()
            run(case)
            if case.startswith("compiled"):
                compile_s[case.split()[1]] = round(time.perf_counter() - began, 1)
        for _ in range(args.warmup):
            for case in CASES:
                run(case)
        times: dict[str, list[float]] = {case: [] for case in CASES}
        for r in range(args.rounds):
            for case in CASES if r % 2 == 0 else CASES[::-1]:
                times[case].append(_timed(lambda c=case: run(c)))
        ms = {case: round(1000 * statistics.median(t), 2) for case, t in times.items()}
        rows[str(T)] = {"ms": ms, "first_call_s": compile_s}
        print(f"T={T}: {ms}", flush=True)
    return {"batch": BATCH, "trained_blocks": TRAINED, "rounds": args.rounds, "lengths": rows}


def _timed(fn: Callable[[], Any]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def render(data: dict[str, Any]) -> list[str]:
    r = data["results"]
    lines = [
        "# The main job's trained blocks under torch.compile: eager against compiled, "
        "fp32 against bf16",
        "",
        machine_line(data["machine"]),
        "",
        f"Forward and backward of the top {r['trained_blocks']} blocks of multilingual-e5-small "
        f"(real weights, dropout 0.1 on the sub-layer outputs) on {r['batch']} random kept "
        "states of each length, a quarter of them half as long; no optimizer. Milliseconds, "
        f"the median of {r['rounds']} alternating rounds; the script's docstring says more.",
        "",
        "| pieces | eager fp32 | eager bf16 | compiled fp32 | compiled bf16 | bf16 over fp32, "
        "eager | bf16 over fp32, compiled | compiled over eager, bf16 | first compiled call "
        "fp32 / bf16 (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for T, row in r["lengths"].items():
        ms, first = row["ms"], row["first_call_s"]
        lines.append(
            f"| {T} | {ms['eager fp32']} | {ms['eager bf16']} | {ms['compiled fp32']} | "
            f"{ms['compiled bf16']} | {ms['eager fp32'] / ms['eager bf16']:.2f}x | "
            f"{ms['compiled fp32'] / ms['compiled bf16']:.2f}x | "
            f"{ms['eager bf16'] / ms['compiled bf16']:.2f}x | {first['fp32']} / {first['bf16']} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    threads = set_threads(args.threads)
    info = machine(threads)
    results = measure(args)
    info["load_average_at_end"] = load_average()
    data = {"machine": info, "command": command_line(argv), "results": results}
    write_results(STEM, data, render(data))


if __name__ == "__main__":
    main()
