"""Where the time of predict's fastest path goes: torch's profiler over one batch of the bf16
pass through ``torch.compile`` (the part of ``attnlab.load(RUN, precision="bf16",
compile=True)`` that every text takes; its float32 re-run of close calls is left out).

    python -m benchmarks.infer.profile_pass RUN [--kind long] [--texts 32]
        -> docs/results/profile_pass.{json,md}

The batch is the ``--texts`` longest bundled reviews (``--kind long``, cut at the run's
length) or ``--texts`` short ones (``--kind short``, as benchmarks/infer/throughput.py picks
them); one thread; two warm-up calls, then ``--calls`` profiled calls (each row's time is
their mean) with Inductor's per-kernel profiling on, so each generated C++ kernel is its own
row. The Linear layers' rate is 2·M·N·K summed over the ``nn.Linear`` calls of one pass
(counted by hooks on the float32 model) over their profiled time.
"""

from __future__ import annotations

import argparse
import json

from benchmarks.common import RESULTS, command_line, machine, machine_line, write_page

STEM = "profile_pass"
TOP = 12


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a trained e5 / BERT classifier run folder")
    p.add_argument("--kind", choices=("long", "short"), default="long")
    p.add_argument("--texts", type=int, default=32, help="texts in the batch (default 32)")
    p.add_argument("--calls", type=int, default=5, help="profiled calls, averaged (default 5)")
    args = p.parse_args(argv)

    import torch
    from torch._inductor import config as inductor_config

    import attnlab
    from benchmarks.infer.throughput import texts_of

    torch.set_num_threads(1)
    inductor_config.cpp.enable_kernel_profile = True  # each generated kernel a profiler row
    clf = attnlab.load(args.run, precision="bf16", threads=1, compile=True)
    run = clf.run
    texts = texts_of(args.texts, args.texts)[args.kind]
    ids, lengths = run.encode(texts)  # (B, T), (B,)
    fast = run.infer_model.fast  # the compiled bf16 pass (attnlab.infer.precision.Compiled)
    with torch.no_grad():
        for _ in range(2):
            fast(ids, lengths)
        with torch.profiler.profile() as prof:
            for _ in range(args.calls):
                fast(ids, lengths)
    rows = [(e.key, e.self_cpu_time_total / 1e3 / args.calls, e.count // args.calls)
            for e in prof.key_averages()]  # a call's share: ms and calls per pass
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    linear_flops = linear_work(run.model, ids, lengths)
    linear_ms = sum(ms for key, ms, _ in rows if "linear" in key.lower())
    results = {
        "command": command_line(argv),
        "machine": machine(threads=1),
        "run": args.run,
        "kind": args.kind,
        "batch": list(ids.shape),
        "calls": args.calls,
        "total_ms": total,
        "linear_gflops": linear_flops / (linear_ms / 1e3) / 1e9 if linear_ms else None,
        "rows": [{"op": k, "ms": ms, "calls": n} for k, ms, n in rows[:TOP]],
    }
    (RESULTS / f"{STEM}.json").write_text(json.dumps(results, indent=1) + "\n")
    write_page(RESULTS / f"{STEM}.md", render(results), results["command"])
    print(render(results))


def linear_work(model, ids, lengths) -> int:
    """2·M·N·K summed over the ``nn.Linear`` calls of one float32 pass of ``model``."""
    import torch

    work = [0]

    def count(module, inputs, _output) -> None:
        rows = inputs[0].numel() // module.in_features
        work[0] += 2 * rows * module.in_features * module.out_features

    hooks = [m.register_forward_hook(count) for m in model.modules()
             if isinstance(m, torch.nn.Linear)]  # fmt: skip
    try:
        with torch.no_grad():
            model(ids, lengths)
    finally:
        for hook in hooks:
            hook.remove()
    return work[0]


def render(r: dict) -> str:
    lines = [
        "# Where the compiled bf16 pass spends its time",
        "",
        machine_line(r["machine"]),
        "",
        f"Run: `{r['run']}`. One batch of {r['batch'][0]} {r['kind']} bundled reviews, "
        f"{r['batch'][1]} pieces wide, through the bf16 pass of `attnlab.load(RUN, "
        "precision=\"bf16\", compile=True)`, one thread, profiled over "
        f"{r['calls']} calls after two warm-up calls (self CPU time, the mean of a call: "
        f"{r['total_ms']:.0f} ms in all). The Linear layers ran at "
        f"{r['linear_gflops']:.0f} GFLOP/s (2·M·N·K of the pass's Linear calls over their "
        "profiled time); `cpp_fused_*` rows are Inductor's generated kernels.",
        "",
        "| op | ms | share | calls |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| `{row['op'][:70]}` | {row['ms']:.1f} | {row['ms'] / r['total_ms']:.1%} | "
              f"{row['calls']} |" for row in r["rows"]]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
