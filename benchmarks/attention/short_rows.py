"""Attention over short rows on the CPU: torch's fused kernel against the matmul backend, the
measurement behind ``attnlab.layers.attention.MATMUL_MAX_KEYS``.

    python -m benchmarks.attention.short_rows     # docs/results/attention_short_rows.{md,json}

e5-small's attention (12 heads of 32) at key lengths 8-512, about 2,048 tokens a batch (a
predict batch of short reviews holds 64 texts of about 30 pieces), a key padding mask (each row
between half the length and all of it), q, k, v strided views of one projection's output as in
a model, no gradient, one thread: ``scaled_dot_product_attention(..., backend="fused")``
(torch's flash kernel for the CPU) against ``backend="matmul"`` (``matmul_attention``: two
batched products around a softmax in the products' dtype, whatever the length, here), in
float32 and under bf16 autocast where the CPU has native bf16, eager and through
``torch.compile`` (bf16; one graph a shape). Each round times every contender once, back to
back; a contender's time is its best round in CPU time (``time.process_time``), which other
work on the machine's cores stretches far less than wall time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from attnlab.infer.precision import cpu_has_bf16
from attnlab.layers.attention import (
    MATMUL_MAX_KEYS,
    matmul_attention,
    scaled_dot_product_attention,
)
from benchmarks import common

STEM = "attention_short_rows"
HEADS, HEAD_DIM, TOKENS = 12, 32, 2048
LENGTHS = (8, 16, 24, 32, 48, 64, 96, 100, 128, 192, 256, 512)
COMPILED_LENGTHS = (16, 32, 64, 128, 256)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="rounds; each contender's best counts")
    p.add_argument("--calls", type=int, default=10, help="calls a round")
    return p


def inputs(T: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q, k, v (B, H, T, D) strided views of one (B, T, 3, H, D) tensor, and a key padding mask
    (B, 1, 1, T), B = TOKENS // T."""
    g = torch.Generator().manual_seed(seed)
    B = max(1, TOKENS // T)
    qkv = torch.randn(B, T, 3, HEADS, HEAD_DIM, generator=g)  # (B, T, 3, H, D)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, T, D) each
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T)
    return q, k, v, mask


def best_ms(calls: dict[str, Callable[[], object]], rounds: int, n: int) -> dict[str, float]:
    """Milliseconds of CPU time a call, each contender's best round, the rounds interleaved."""
    best = {name: float("inf") for name in calls}
    for call in calls.values():  # warm-up: first-call allocations, kernels chosen
        call()
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.process_time()
            for _ in range(n):
                call()
            best[name] = min(best[name], (time.process_time() - start) / n * 1e3)
    return best


def contenders(T: int, dtype: torch.dtype, compiled: bool) -> dict[str, Callable[[], object]]:
    q, k, v, mask = inputs(T)
    low = dtype != torch.float32

    def call(backend: str) -> Callable[[], object]:
        def attend(q, k, v, mask):
            with torch.autocast("cpu", dtype=dtype, enabled=low):
                if backend == "matmul":  # its steps whatever the length and dtype
                    return matmul_attention(q, k, v, mask, False, None, HEAD_DIM**-0.5)
                return scaled_dot_product_attention(q, k, v, mask, backend=backend)[0]

        fn = torch.compile(attend, dynamic=False) if compiled else attend
        return lambda: fn(q, k, v, mask)

    return {"fused": call("fused"), "matmul": call("matmul")}


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    torch.set_num_threads(1)
    info = common.machine(threads=1)
    settings = [("fp32", torch.float32, False, LENGTHS)]
    if cpu_has_bf16():
        settings += [("bf16", torch.bfloat16, False, LENGTHS),
                     ("bf16 compiled", torch.bfloat16, True, COMPILED_LENGTHS)]  # fmt: skip
    rows = []
    with torch.no_grad():
        for name, dtype, compiled, lengths in settings:
            for T in lengths:
                torch._dynamo.reset()  # one graph a shape, each compiled afresh
                ms = best_ms(contenders(T, dtype, compiled), args.rounds, args.calls)
                rows.append({"setting": name, "keys": T, "batch": max(1, TOKENS // T), **ms})
                print(f"{name} T={T}: fused {ms['fused']:.2f} ms, matmul {ms['matmul']:.2f} ms",
                      flush=True)  # fmt: skip
    info["load_average_at_end"] = common.load_average()
    results = {"command": common.command_line(argv), "machine": info, "rows": rows,
               "matmul_max_keys": MATMUL_MAX_KEYS}  # fmt: skip
    common.write_results(STEM, results, render(results))


def render(r: dict) -> str:
    lines = [
        "# Attention over short rows on the CPU: the fused kernel against the matmul backend",
        "",
        common.machine_line(r["machine"]),
        "",
        f"e5-small's attention ({HEADS} heads of {HEAD_DIM}), about {TOKENS} tokens a batch, a key "
        "padding mask, no gradient, one thread; milliseconds of CPU time a call (each "
        "contender's best of the interleaved rounds). `fused` is torch's flash kernel for the "
        "CPU; `matmul` is attnlab's matmul backend (batched products around a softmax, in the "
        "products' dtype), measured here at every length.",
        "",
        "| setting | keys | batch | fused ms | matmul ms | fused / matmul |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        lines.append(f"| {row['setting']} | {row['keys']} | {row['batch']} | {row['fused']:.2f} "
                     f"| {row['matmul']:.2f} | {row['fused'] / row['matmul']:.2f} |")  # fmt: skip
    limit = r["matmul_max_keys"]
    lines += ["", f"The backend computes bf16 rows of at most MATMUL_MAX_KEYS = {limit} keys and "
              "leaves longer ones, and every float32 call, to the fused kernel:", ""]  # fmt: skip
    for setting in dict.fromkeys(row["setting"] for row in r["rows"]):
        rs = [row for row in r["rows"] if row["setting"] == setting]
        ratio = [row["fused"] / row["matmul"] for row in rs]
        if setting == "fp32":
            lines.append(f"- {setting}: the matmul steps run {min(ratio):.2f}-{max(ratio):.2f}x "
                         "the fused kernel's speed")  # fmt: skip
            continue
        inside = [row["fused"] / row["matmul"] for row in rs if row["keys"] <= limit]
        past = [row["fused"] / row["matmul"] for row in rs if row["keys"] > limit]
        line = (f"- {setting}: up to {limit} keys the matmul backend runs "
                f"{min(inside):.2f}-{max(inside):.2f}x the fused kernel's speed")  # fmt: skip
        if past:
            line += f"; past them {min(past):.2f}-{max(past):.2f}x"
        lines.append(line)
    lines += ["", "So attnlab's bf16 inference path (attnlab.infer.precision.Autocast) takes "
              "the matmul backend, and float32 keeps the fused kernel."]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
