"""Forward time and peak memory of the Triton FlashAttention against SDPA and attnlab.layers.flash.

    python -m benchmarks.attention.flash_triton --device cuda [--lengths 1024 2048 4096 8192]
                                      [--dtype bfloat16] [--out OUT]      (scripts/gpu_check.sh)
    python -m benchmarks.attention.flash_triton --quick --out OUT     (CPU, interpreter)

Causal self-attention forward, q/k/v (batch, heads, T, head_dim), three kernels:
``sdpa`` (F.scaled_dot_product_attention: on CUDA its flash / memory-efficient kernels),
``triton`` (attnlab.layers.flash_triton.flash_attention_triton, one program per query block) and
``torch_flash`` (attnlab.layers.flash.flash_attention: the same algorithm in PyTorch tensor ops, a
Python loop over tiles). Time: median of --repeats calls after --warmup ones (the first Triton
call compiles), CUDA-synchronised. Memory: peak CUDA memory allocated during one call above
what was allocated before it (q, k, v excluded; the output included). Error: largest absolute
difference of the output from sdpa's. A kernel that fails (e.g. out of memory) is recorded
with its error and the rest still run. Without triton the triton rows say so (exit 0).

``--quick`` runs on the CPU at toy sizes under Triton's interpreter (TRITON_INTERPRET=1, set
here before anything imports triton): it checks the plumbing, its times mean nothing.
Writes OUT.json and OUT.md (default docs/results/flash_triton).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks import common

KERNELS = ("sdpa", "triton", "torch_flash")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="CPU, interpreter, toy sizes")
    parser.add_argument("--out", default="docs/results/flash_triton")
    args = parser.parse_args(argv)
    if args.quick:
        args.device, args.lengths, args.dtype = "cpu", [64, 128], "float32"
        args.batch, args.heads, args.head_dim, args.warmup, args.repeats = 1, 2, 32, 0, 1
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (torch may import it)

    import torch
    import torch.nn.functional as F

    from attnlab.layers.flash import flash_attention
    from attnlab.layers.flash_triton import flash_attention_triton

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if device.type == "cpu" and not args.quick:
        print("the Triton kernel runs on CUDA; on the CPU use --quick", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None

    kernels = {
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "triton": lambda q, k, v: flash_attention_triton(q, k, v, is_causal=True),
        "torch_flash": lambda q, k, v: flash_attention(q, k, v, is_causal=True),
    }

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def measure(fn, q, k, v) -> dict:
        for _ in range(args.warmup):
            fn(q, k, v)
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device) if cuda else 0
        times = []
        out = None
        for _ in range(max(1, args.repeats)):
            del out
            sync()
            t0 = time.perf_counter()
            out = fn(q, k, v)
            sync()
            times.append((time.perf_counter() - t0) * 1000)
        row = {"ms": round(statistics.median(times), 3)}
        if cuda:
            row["peak_mib"] = round((torch.cuda.max_memory_allocated(device) - before) / 2**20, 1)
        return row | {"out": out}

    points: dict[str, list[dict]] = {name: [] for name in KERNELS}
    torch.manual_seed(0)
    with torch.no_grad():
        for T in args.lengths:
            shape = (args.batch, args.heads, T, args.head_dim)
            q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
            reference = None
            for name in KERNELS:
                row: dict = {"T": T}
                if name == "triton" and triton_version is None:
                    row["skipped"] = "triton is not installed"
                else:
                    try:
                        result = measure(kernels[name], q, k, v)
                        out = result.pop("out")
                        if reference is None:
                            reference = out.float()
                        else:
                            row["max_abs_err"] = float((out.float() - reference).abs().max())
                        del out
                        row.update(result)
                    except Exception as err:  # recorded; the other kernels still run
                        row["skipped"] = f"{type(err).__name__}: {str(err)[:300]}"
                if cuda:
                    torch.cuda.empty_cache()
                print(name, row, flush=True)
                points[name].append(row)
            del q, k, v, reference

    info = common.machine(device=str(device))
    if cuda:
        info["gpu"] = torch.cuda.get_device_name(device)
    info["triton"] = triton_version
    settings = dict(batch=args.batch, heads=args.heads, head_dim=args.head_dim, dtype=args.dtype,
                    causal=True, warmup=args.warmup, repeats=args.repeats, quick=args.quick,
                    triton_blocks=64, torch_flash_blocks=128)  # fmt: skip
    command = "python -m benchmarks.attention.flash_triton " + " ".join(sys.argv[1:])
    result = {"command": command, "settings": settings, "points": points, "machine": info}
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")

    where = info.get("gpu", info.get("cpu", "")) + f", torch {torch.__version__}"
    lines = [
        "# Triton FlashAttention forward against SDPA and attnlab.layers.flash",
        "",
        f"`{command}`",
        "",
        f"Causal forward, q/k/v ({args.batch}, {args.heads}, T, {args.head_dim}) {args.dtype} on "
        f"{device} ({where}, triton {triton_version}). Median of {args.repeats} calls after "
        f"{args.warmup} warm-up calls; peak = CUDA memory allocated above the inputs during the "
        "calls; error = largest |output − sdpa's output|."
        + (" Interpreter on CPU at toy sizes: the times mean nothing." if args.quick else ""),
        "",
        "| T | " + " | ".join(f"{k} ms" for k in KERNELS) + " | "
        + " | ".join(f"{k} MiB" for k in KERNELS) + " | triton err | torch_flash err |",
        "|---:|" + "---:|" * (2 * len(KERNELS) + 2),
    ]  # fmt: skip
    for i, T in enumerate(args.lengths):
        rows = [points[name][i] for name in KERNELS]
        ms = ["—" if "ms" not in r else f"{r['ms']:.3f}" for r in rows]
        mib = ["—" if "peak_mib" not in r else f"{r['peak_mib']:.1f}" for r in rows]
        err = ["—" if "max_abs_err" not in r else f"{r['max_abs_err']:.1e}" for r in rows[1:]]
        lines.append(f"| {T} | " + " | ".join(ms + mib + err) + " |")
    skipped = [
        f"{k} T={r['T']}: {r['skipped']}" for k in KERNELS for r in points[k] if "skipped" in r
    ]
    if skipped:
        lines += ["", "Not measured: " + "; ".join(skipped) + "."]
    common.write_page(out_path.with_suffix(".md"), lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
