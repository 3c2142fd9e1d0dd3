"""int8 quantisation: size on disk, CPU latency and quality for fp32, bf16, attnlab int8
(weight-only and dynamic activations) and torch.ao's dynamic int8.

    python -m benchmarks.infer.int8 [--work runs/bench_int8] [--lm runs/bench_speculative/target]

Runs measured (trained here unless --work / --lm already hold them, one thread):
* classify: `attnlab train classify` (default preset, the bundled Chinese reviews) for at most
  --classify-minutes; quality = test accuracy and macro-F1 (`run.evaluate`);
* lm: the Shakespeare target of benchmarks/infer/speculative.py (6 × 384, context 128); quality =
  mean validation loss over --lm-windows evenly spaced windows;
* translate: `attnlab train translate --config copy` (the synthetic copy task) for
  --translate-steps steps; quality = test BLEU and chrF (greedy; no latency row).
Each variant is the same loaded model: fp32; bf16 (``model.to(torch.bfloat16)``); attnlab int8
weight-only and dynamic (`attnlab quantize`'s layers, :func:`attnlab.compress.int8.quantize_model`);
torch.ao dynamic int8 (``quantize_dynamic(model, {nn.Linear}, qint8)``). Size on disk: the
weights file as `attnlab quantize` writes it (safetensors), bf16 as safetensors, torch.ao's
state dict with torch.save (its packed weights have no safetensors form). Latency: median of
--repeats forward passes at batch 1 and 32 (classify: 64 tokens; lm: --lm-latency-tokens), the
variants interleaved; beside it, each variant's time over torch.ao's in the same round (the
median of those ratios, which a shared machine's load shifts less than the times). Writes
docs/results/int8.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from attnlab.compress.int8 import quantize_model
from attnlab.runs import training
from attnlab.runs.load import load_run
from attnlab.train.checkpoint import save_weights
from benchmarks import common

VARIANTS = ("fp32", "bf16", "attnlab int8", "attnlab int8 dynamic", "torch.ao dynamic int8")
REFERENCE = VARIANTS[-1]  # latencies are also given relative to it
DEFAULTS = {"work": "runs/bench_int8", "lm": "runs/bench_speculative/target"}


def variant(model: nn.Module, name: str) -> nn.Module:
    model = copy.deepcopy(model).eval()
    if name == "bf16":
        return model.to(torch.bfloat16)
    if name == "attnlab int8":
        quantize_model(model, "none")
    elif name == "attnlab int8 dynamic":
        quantize_model(model, "dynamic")
    elif name == "torch.ao dynamic int8":
        model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    return model


def size_mib(model: nn.Module, name: str) -> float:
    if name == "torch.ao dynamic int8":
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        return buffer.tell() / 2**20
    with tempfile.TemporaryDirectory() as tmp:
        path = save_weights(model, Path(tmp) / "w.safetensors")
        return path.stat().st_size / 2**20


@torch.no_grad()
def latency_ms(models: dict[str, nn.Module], make_input, repeats: int) -> dict[str, tuple]:
    """name -> (median ms, median over rounds of its time / REFERENCE's time that round)."""
    samples: dict[str, list[float]] = {n: [] for n in models}
    for name, model in models.items():  # warm-up
        model(*make_input(name))
    for _ in range(repeats):
        for name, model in models.items():
            args = make_input(name)
            start = time.perf_counter()
            model(*args)
            samples[name].append(1e3 * (time.perf_counter() - start))
    ref = samples[REFERENCE]
    return {
        n: (statistics.median(s), statistics.median(a / b for a, b in zip(s, ref)))
        for n, s in samples.items()
    }


def add_latency(rows: dict, lat: dict[str, tuple], batch: int) -> None:
    for name, (ms, ratio) in lat.items():
        rows[name][f"ms_batch{batch}"] = ms
        rows[name][f"x_ao_batch{batch}"] = ratio


def ensure(task: str, out: Path, overrides: dict, preset: str | None = None) -> None:
    if not (out / "results.json").exists():
        training.train(task, out, overrides, preset)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=DEFAULTS["work"])
    parser.add_argument("--lm", default=DEFAULTS["lm"])
    parser.add_argument("--classify-minutes", type=float, default=3.0)
    parser.add_argument("--translate-steps", type=int, default=700)
    parser.add_argument("--lm-windows", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--lm-latency-tokens", type=int, default=32, help="tokens per row")
    parser.add_argument("--tasks", default="classify,lm,translate")
    parser.add_argument("--out", default="docs/results/int8")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    work = Path(args.work)
    ensure("classify", work / "classify", {"max_minutes": str(args.classify_minutes),
                                            "num_threads": "1"})  # fmt: skip
    ensure("translate", work / "translate", {"max_steps": str(args.translate_steps),
                                              "num_threads": "1"}, "copy")  # fmt: skip
    load_start = common.load_average()
    table: dict[str, dict[str, dict]] = {}

    tasks = args.tasks.split(",")
    if "classify" in tasks:
        table["classify"] = bench_classify(work, args)
        print("classify", table["classify"], flush=True)
    if "lm" in tasks:
        table["lm"] = bench_lm(args)
        print("lm", table["lm"], flush=True)
    if "translate" in tasks:
        table["translate"] = bench_translate(work)
        print("translate", table["translate"], flush=True)
    write(table, args, load_start)


def bench_classify(work: Path, args: argparse.Namespace) -> dict:
    run = load_run(work / "classify")
    base = run.model
    models = {n: variant(base, n) for n in VARIANTS}
    rows = {}
    for name, model in models.items():
        run.model = model
        report = run.evaluate(split="test")
        rows[name] = {"size_mib": size_mib(model, name), "accuracy": report["accuracy"],
                      "macro_f1": report["macro_f1"]}  # fmt: skip
    vocab = base.cfg.vocab_size if hasattr(base, "cfg") else 100
    for batch in (1, 32):
        ids = torch.randint(1, vocab, (batch, 64))
        lengths = torch.full((batch,), 64)
        lat = latency_ms(models, lambda n, ids=ids, lengths=lengths: (ids, lengths), args.repeats)
        add_latency(rows, lat, batch)
    return rows


def bench_lm(args: argparse.Namespace) -> dict:
    from attnlab.data.text_lm import eval_starts, open_tokens
    from attnlab.tasks.lm import mean_loss

    run = load_run(args.lm)
    base = run.model
    val = open_tokens(Path(args.lm) / "data" / "val.bin", run.tokenizer.vocab_size)
    starts = eval_starts(len(val), base.cfg.context, args.lm_windows)
    models = {n: variant(base, n) for n in VARIANTS}
    rows = {}
    for name, model in models.items():
        model.cfg = base.cfg  # torch.ao's copy keeps it; mean_loss reads the context
        rows[name] = {"size_mib": size_mib(model, name),
                      "val_loss": mean_loss(model, val, starts, 16)}  # fmt: skip
    for batch in (1, 32):
        ids = torch.randint(0, base.cfg.vocab_size, (batch, args.lm_latency_tokens))
        add_latency(rows, latency_ms(models, lambda n, ids=ids: (ids,), args.repeats), batch)
    return rows


def bench_translate(work: Path) -> dict:
    """Quality and size only."""
    run = load_run(work / "translate")
    base = run.model
    rows = {}
    for name in VARIANTS:
        model = variant(base, name)
        run.model = model
        try:
            report = run.evaluate(split="test")
            rows[name] = {"size_mib": size_mib(model, name), "bleu": report["bleu"],
                          "chrf": report["chrf"]}  # fmt: skip
        except Exception as err:  # noqa: BLE001 - a variant the decoder cannot run is reported
            rows[name] = {"size_mib": size_mib(model, name), "error": str(err).splitlines()[0]}
    return rows


def write(table: dict, args: argparse.Namespace, load_start: list[float]) -> None:
    info = common.machine()
    info["load_average_at_start"] = load_start
    info["load_average_at_end"] = common.load_average()
    command = (
        f"python -m benchmarks.infer.int8 --tasks {args.tasks} --lm-windows {args.lm_windows} "
        f"--repeats {args.repeats} --lm-latency-tokens {args.lm_latency_tokens}"
    )
    for flag in ("work", "lm"):  # where the runs were, when not the default folders
        if getattr(args, flag) != DEFAULTS[flag]:
            command += f" --{flag} {getattr(args, flag)}"
    result = {"command": command, "table": table, "machine": info,
              "settings": vars(args)}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# int8 quantisation: size, CPU latency, quality",
        "",
        f"`{command}`",
        "",
        f"One thread; load average {load_start[0]:.1f} at start, "
        f"{info['load_average_at_end'][0]:.1f} at end ({info['cpu']}, {info['logical_cores']} "
        "cores shared with other jobs). Latency: median of "
        f"{args.repeats} interleaved forward passes; × torch.ao: the median over those rounds "
        "of the variant's time over torch.ao's. Runs: see the script's docstring.",
        "",
    ]
    for task, cols in (
        ("classify", ("accuracy", "macro_f1")),
        ("lm", ("val_loss",)),
        ("translate", ("bleu", "chrf")),
    ):
        if task not in table:
            continue
        rows = table[task]
        lat = task != "translate"
        timing = ["ms batch 1", "ms batch 32", "× torch.ao batch 1", "× torch.ao batch 32"]
        head = ["variant", "size MiB", *cols] + (timing if lat else [])
        lines += [f"## {task}", "", "| " + " | ".join(head) + " |",
                  "|---|" + "---:|" * (len(head) - 1)]  # fmt: skip
        for name, r in rows.items():
            if "error" in r:
                lines.append(f"| {name} | {r['size_mib']:.2f} | error: {r['error']} |")
                continue
            cells = [f"{r['size_mib']:.2f}"] + [_quality(r[c]) for c in cols]
            if lat:
                cells += [f"{r['ms_batch1']:.1f}", f"{r['ms_batch32']:.1f}",
                          f"{r['x_ao_batch1']:.2f}", f"{r['x_ao_batch32']:.2f}"]  # fmt: skip
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    common.write_page(out.with_suffix(".md"), lines)
    print("\n".join(lines))


def _quality(value: float | None) -> str:
    """A quality figure for the table; None (e.g. BLEU of one-word sentences, which have no
    4-grams) is shown as n/a, as `attnlab eval` shows it."""
    return "n/a" if value is None else f"{value:.4f}"


if __name__ == "__main__":
    main()
