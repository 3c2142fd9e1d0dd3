"""Peak memory and time of causal attention forward + backward against T: explicit, fused, flash.

    python -m benchmarks.attention.flash_memory [--max-T 16384] [--explicit-max-T 8192]
        [--block 128]

q, k, v of shape (1, 1, T, 64) in float32 (one sequence, one head: attention alone, so its
memory is not hidden under a block's activations), one thread, causal. Three kernels:
``explicit`` (attnlab's step-by-step path, which keeps the T×T weights for the backward),
``fused`` (F.scaled_dot_product_attention, PyTorch's CPU flash kernel) and ``flash``
(attnlab.layers.flash, tiles of --block × --block, backward by recomputation). Every point runs in a
fresh process (src/attnlab/bench/memory.py: the rise of the peak resident set size over the
step). The explicit path stops at --explicit-max-T: at 16k its T×T float32 tensors alone would
need several GiB on a machine shared by other jobs. Writes docs/results/flash_memory.{json,md}
with the exponent k of memory ∝ T^k and time ∝ T^k fitted over T >= 2048.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnlab.bench.memory import run_isolated
from attnlab.bench.scaling import fit_exponent
from benchmarks import common

KINDS = ("explicit", "fused", "flash")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-T", type=int, default=16384)
    parser.add_argument("--explicit-max-T", type=int, default=8192)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="docs/results/flash_memory")
    args = parser.parse_args(argv)
    lengths = [1024 * 2**i for i in range(6) if 1024 * 2**i <= args.max_T]
    load_start = common.load_average()
    points: dict[str, list[dict]] = {k: [] for k in KINDS}
    for kind in KINDS:
        for T in lengths:
            row: dict = {"T": T}
            if kind == "explicit" and args.explicit_max_T < T:
                row["skipped"] = f"T > --explicit-max-T {args.explicit_max_T} (T×T tensors)"
            else:
                spec = dict(
                    case="attention", kind=kind, T=T, batch=1, n_heads=1,
                    head_dim=args.head_dim, block=args.block, threads=1,
                    repeats=args.repeats, time_cap_s=60.0,
                )  # fmt: skip
                res = run_isolated(spec, timeout_s=600)
                if "error" in res:
                    row["skipped"] = res["error"]
                else:
                    row.update(ms=round(res["median_ms"], 1), peak_mib=round(res["peak_mib"], 1))
            print(kind, row, flush=True)
            points[kind].append(row)
    exponents = {
        kind: {
            m: fit_exponent([(r["T"], r[m]) for r in rows if m in r], 2048)
            for m in ("peak_mib", "ms")
        }
        for kind, rows in points.items()
    }
    info = common.machine()
    info["load_average_at_start"] = load_start
    info["load_average_at_end"] = common.load_average()
    settings = {"batch": 1, "heads": 1, "head_dim": args.head_dim, "block": args.block,
                "dtype": "float32", "causal": True, "threads": 1}  # fmt: skip
    command = (
        f"python -m benchmarks.attention.flash_memory --max-T {args.max_T} "
        f"--explicit-max-T {args.explicit_max_T} --block {args.block}"
    )
    result = {"command": command, "settings": settings, "points": points,
              "exponents": exponents, "machine": info}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# FlashAttention by hand: memory and time of forward + backward",
        "",
        f"`{command}`",
        "",
        f"Causal attention alone, q/k/v (1, 1, T, {args.head_dim}) float32, one thread; "
        "peak = rise of the resident set size over one step (fresh process per point); "
        "time = median of the next steps. "
        f"Load average {load_start[0]:.1f} at start, {info['load_average_at_end'][0]:.1f} at end "
        f"({info.get('cpu', '')}).",
        "",
        "| T | " + " | ".join(f"{k} MiB | {k} ms" for k in KINDS) + " |",
        "|---:|" + "---:|" * (2 * len(KINDS)),
    ]
    for i, T in enumerate(lengths):
        cells = []
        for kind in KINDS:
            r = points[kind][i]
            cells += ["—", "—"] if "skipped" in r else [f"{r['peak_mib']:.1f}", f"{r['ms']:.0f}"]
        lines.append(f"| {T} | " + " | ".join(cells) + " |")
    lines += ["", "Exponent k (y ∝ T^k, least squares over T ≥ 2048):", ""]
    lines += ["| kernel | memory k | time k |", "|---|---:|---:|"]
    for kind in KINDS:
        e = exponents[kind]
        fmt = lambda x: "—" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(f"| {kind} | {fmt(e['peak_mib'])} | {fmt(e['ms'])} |")
    skipped = [
        f"{k} T={r['T']}: {r['skipped']}" for k in KINDS for r in points[k] if "skipped" in r
    ]
    if skipped:
        lines += ["", "Not measured: " + "; ".join(skipped) + "."]
    common.write_page(out.with_suffix(".md"), lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
