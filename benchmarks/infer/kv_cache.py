"""The int8 KV cache beside the float one: bytes per token, validation loss, tokens/s.

    python -m benchmarks.infer.kv_cache [--lm runs/bench_speculative/target] [--windows 12]

On the Shakespeare target of benchmarks/infer/speculative.py (6 layers × 384, 6 heads, context 128,
float32, one thread): (1) bytes the cache holds per token (keys and values of every layer,
the int8 scales included); (2) validation loss teacher-forced through the cache, one token per
step over whole 128-token windows (--windows evenly spaced windows of the validation split), so
that every prediction reads the cached keys and values, beside the uncached full forward;
(3) greedy decoding speed, --tokens tokens from a 64-token prompt, the two caches interleaved,
--repeats times. Writes docs/results/kv_cache.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.data.text_lm import eval_starts, open_tokens
from attnlab.infer.generation import Generation, new_caches
from attnlab.runs.load import load_run
from benchmarks import common

KINDS = ("float", "int8")


@torch.no_grad()
def cached_loss(model, windows: list[torch.Tensor], kind: str) -> float:
    """Mean next-token loss, every token fed through the cache one at a time."""
    total, count = 0.0, 0
    for w in windows:  # (1, T + 1)
        caches = new_caches(model, kind)
        for t in range(w.shape[1] - 1):
            logits = model(w[:, t : t + 1], caches=caches)[:, -1]  # (1, V)
            total += float(F.cross_entropy(logits, w[:, t + 1]))
            count += 1
    return total / count


@torch.no_grad()
def full_loss(model, windows: list[torch.Tensor]) -> float:
    total, count = 0.0, 0
    for w in windows:
        logits = model(w[:, :-1])[0]  # (T, V)
        total += float(F.cross_entropy(logits, w[0, 1:], reduction="sum"))
        count += w.shape[1] - 1
    return total / count


@torch.no_grad()
def decode_s(model, prompt: torch.Tensor, n: int, kind: str) -> float:
    start = time.perf_counter()
    gen = Generation(model, prompt, kv_cache=kind)
    for _ in range(n):
        gen.append(gen.next_logits().argmax(-1))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", default="runs/bench_speculative/target")
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="docs/results/kv_cache")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    run = load_run(args.lm)
    model = run.model.eval()
    T = model.cfg.context
    val = open_tokens(Path(args.lm) / "data" / "val.bin", run.tokenizer.vocab_size)
    starts = eval_starts(len(val) - 1, T + 1, args.windows)
    windows = [torch.tensor(val[s : s + T + 1].astype("int64"))[None] for s in starts]
    load_start = common.load_average()
    rows = {}
    reference = full_loss(model, windows)
    for kind in KINDS:
        caches = new_caches(model, kind)
        model(windows[0][:, :T], caches=caches)
        attn = [c for c in caches if hasattr(c, "keys")]
        if kind == "float":
            per_token = sum(2 * c.keys.shape[1] * c.keys.shape[3] * 4 for c in attn)
        else:
            per_token = sum(c.nbytes_per_token() for c in attn)
        rows[kind] = {
            "bytes_per_token": per_token,
            "val_loss_cached": cached_loss(model, windows, kind),
        }
    prompt = windows[0][:, :64]
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(args.repeats):
        for kind in KINDS:
            times[kind].append(decode_s(model, prompt, args.tokens, kind))
    for kind in KINDS:
        rows[kind]["tokens_per_s"] = args.tokens / statistics.median(times[kind])
    info = common.machine()
    info["load_average_at_start"] = load_start
    info["load_average_at_end"] = common.load_average()
    command = f"python -m benchmarks.infer.kv_cache --windows {args.windows} --tokens {args.tokens}"
    result = {"command": command, "val_loss_uncached": reference, "rows": rows, "machine": info}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# int8 KV cache beside the float cache",
        "",
        f"`{command}`",
        "",
        f"Target of benchmarks/infer/speculative.py (6 × 384, context {T}), float32, one thread; "
        f"validation loss teacher-forced one token per step through the cache over "
        f"{len(windows)} windows of {T} tokens (uncached full forward: {reference:.6f}); "
        f"decoding: greedy, {args.tokens} tokens, median of {args.repeats}. Load average "
        f"{load_start[0]:.1f} at start, {info['load_average_at_end'][0]:.1f} at end.",
        "",
        "| cache | bytes per token | val loss (cached) | tokens/s |",
        "|---|---:|---:|---:|",
    ]
    for kind, r in rows.items():
        lines.append(f"| {kind} | {r['bytes_per_token']:,} | {r['val_loss_cached']:.6f} | "
                     f"{r['tokens_per_s']:.1f} |")  # fmt: skip
    common.write_page(out.with_suffix(".md"), lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
