"""Which CPU attention kernel PyTorch runs with and without dropout, and what it allocates.

    python -m benchmarks.attention.sdpa_dropout_memory
        -> docs/results/sdpa_dropout_memory.{json,md}

One ``F.scaled_dot_product_attention`` forward + backward at the main job's largest training
shape (batch 64, 4 heads, 192 positions, head width 32), with and without a key-padding mask
and attention dropout 0.1, under torch.profiler: the kernel chosen and the bytes allocated
(the sum of every allocation during forward and backward, not the peak). One thread.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from benchmarks import common

OUT = common.RESULTS / "sdpa_dropout_memory"
B, H, T, D = 64, 4, 192, 32


def measure(dropout: float, masked: bool) -> dict:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    mask = None
    if masked:
        mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
        mask[:, :, :, 150:] = False  # padding after position 150
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        out.sum().backward()
    events = prof.key_averages()
    kernels = sorted({e.key for e in events if "scaled_dot_product" in e.key and "_for_cpu" in e.key
                      or e.key == "aten::_scaled_dot_product_attention_math"})  # fmt: skip
    allocated = sum(e.self_cpu_memory_usage for e in events if e.self_cpu_memory_usage > 0)
    return {"dropout": dropout, "mask": masked, "kernels": kernels, "allocated_mib":
            round(allocated / 2**20, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [measure(p, m) for p in (0.0, 0.1) for m in (False, True)]
    OUT.with_suffix(".json").write_text(json.dumps({"torch": torch.__version__, "rows": rows},
                                                   indent=1) + "\n")  # fmt: skip
    lines = [
        "# PyTorch's CPU attention with and without dropout",
        "",
        f"torch {torch.__version__}, one thread: one "
        f"forward + backward of `F.scaled_dot_product_attention` at ({B}, {H}, {T}, {D}), the "
        "main job's largest batch. Allocated = the sum of all allocations during forward and "
        "backward (torch.profiler), not the peak.",
        "",
        "| dropout | key mask | kernel | allocated MiB |",
        "|---:|---|---|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['dropout']} | {'yes' if r['mask'] else 'no'} | "
                     f"{', '.join(r['kernels'])} | {r['allocated_mib']} |")  # fmt: skip
    OUT.with_suffix(".md").write_text(common.with_command(lines, common.command_line()))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
