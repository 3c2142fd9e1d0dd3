"""Training speed of the sequence mixers and of the MoE feed-forward, side by side.

    python -m benchmarks.mixers.speed [--contexts 64 256 1024 2048] [--rounds 5]
        [--out docs/results/mixers_speed]

One process, one torch thread, fp32. Every model is the baby GPT of benchmarks/mixers/quality.py
(4 layers, presets/lm_baby.toml) with one thing changed, and its training step is forward,
cross-entropy, backward, AdamW step (``attnlab.train.optim.build_optimizer``: the optimizer
`attnlab train lm` uses, torch's fused kernel), zero_grad on random tokens (vocabulary 65):

- attention: the preset (width 128, fused causal attention, GELU MLP);
- mamba:     every attention a Mamba block, width 112 (parameters within 3% of attention);
- rwkv:      every layer RWKV-4 (time-mix and channel-mix), width 120 (within 6%);
- moe:       the preset with each MLP 8 experts of its shape, top-2 routing;
- dense2x:   the preset with an MLP twice as wide: the same active parameters per token as moe.

Each context T gets batches of max(1, 768 // T) sequences (768 tokens at T <= 768, one sequence
above). The models take turns step by step, ``rounds`` times after one untimed warm-up step each,
so background load hits all of them alike; a model's figure is its median step in CPU seconds
of this one-thread process (time.process_time: on a shared machine wall-clock time measures
the other jobs too; the wall times are kept in the JSON). Reported: training tokens per CPU
second of each model, and the ratios the issue asks for (mamba / attention, rwkv / attention,
moe step time / dense2x step time). Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.train.optim import build_optimizer
from benchmarks import common

VOCAB = 65
BASE = dict(n_layers=4, n_heads=4, d_model=128, activation="gelu", bias=False, pos="learned")
MODELS: dict[str, dict] = {
    "attention": {},
    "mamba": dict(mixer="mamba", d_model=112),
    "rwkv": dict(mixer="rwkv", d_model=120),
    "moe": dict(ffn="moe", experts=8, top_k=2),
    "dense2x": dict(d_ff=1024),
}


def build(name: str, context: int) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, context=context, **{**BASE, **MODELS[name]}))
    # the optimizer `attnlab train lm` builds (AdamW, torch's fused kernel; TrainConfig's
    # default decay and betas; the learning rate does not change the time of a step)
    return model, build_optimizer(model, lr=1e-4, weight_decay=0.01, betas=(0.9, 0.98))


def step(model: GPT, opt: torch.optim.Optimizer, ids: torch.Tensor) -> None:
    logits = model(ids[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    if model.moe_layers():
        loss = loss + model.aux_loss()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def measure(context: int, rounds: int, names: list[str]) -> dict:
    batch = max(1, 768 // context)
    ids = torch.randint(0, VOCAB, (batch, context + 1))
    built = {n: build(n, context) for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for model, opt in built.values():
        step(model, opt, ids)  # warm-up
    for _ in range(rounds):
        for n, (model, opt) in built.items():
            t0, c0 = time.perf_counter(), time.process_time()
            step(model, opt, ids)
            times[n].append(time.perf_counter() - t0)
            cpu[n].append(time.process_time() - c0)
    tokens = batch * context
    row = {"context": context, "batch": batch, "tokens_per_step": tokens, "models": {}}
    for n in names:
        med = statistics.median(cpu[n])
        row["models"][n] = {
            "params": built[n][0].num_params(),
            "active_params": built[n][0].active_params(),
            "step_cpu_s_median": med,
            "step_cpu_s_all": cpu[n],
            "step_wall_s_all": times[n],
            "tokens_per_s": tokens / med,  # per CPU second of the (one-thread) process
        }
    m = row["models"]
    row["ratios"] = {
        f"{k}_over_attention_tokens_per_s": m[k]["tokens_per_s"] / m["attention"]["tokens_per_s"]
        for k in ("mamba", "rwkv")
        if k in m and "attention" in m
    }
    if "moe" in m and "dense2x" in m:
        row["ratios"]["moe_over_dense2x_step_time"] = (
            m["moe"]["step_cpu_s_median"] / m["dense2x"]["step_cpu_s_median"]
        )
    return row


def markdown(result: dict) -> str:
    names, m = list(MODELS), common.upgrade_machine(result["machine"])
    lines = [
        "# Training speed of the mixers (tokens per CPU second, one thread, fp32)",
        "",
        f"Machine: {m['cpu']}, torch {m['torch']}, {m['torch_threads']} thread; load average "
        f"{result['load_before']} before, "
        f"{result['load_after']} after. Each step is timed in CPU seconds of this one-thread "
        "process (time.process_time), which the machine's load (other jobs) does not inflate "
        "as it does wall-clock time; the models take turns step by step.",
        "",
        "| context | batch | " + " | ".join(names) + " | mamba / attn | rwkv / attn | "
        "moe / dense2x step time |",
        "|---|---|" + "---|" * (len(names) + 3),
    ]
    for row in result["rows"]:
        m, r = row["models"], row["ratios"]
        cells = [f"{m[n]['tokens_per_s']:,.0f}" if n in m else "—" for n in names]
        lines.append(
            f"| {row['context']} | {row['batch']} | "
            + " | ".join(cells)
            + f" | {r.get('mamba_over_attention_tokens_per_s', float('nan')):.2f}"
            + f" | {r.get('rwkv_over_attention_tokens_per_s', float('nan')):.2f}"
            + f" | {r.get('moe_over_dense2x_step_time', float('nan')):.2f} |"
        )
    first = result["rows"][0]["models"]
    lines += [
        "",
        "Parameters (without the position table): "
        + ", ".join(
            f"{n} {first[n]['params']:,}"
            + (f" ({first[n]['active_params']:,} active)" if n == "moe" else "")
            for n in names
            if n in first
        )
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 256, 1024, 2048])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--out", default="docs/results/mixers_speed")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    info = common.machine(threads=1)
    load_before = [round(x, 1) for x in info["load_average_at_start"]]
    rows = []
    for context in args.contexts:
        row = measure(context, args.rounds, args.models)
        print(json.dumps({"context": context, **row["ratios"]}), flush=True)
        rows.append(row)
    result = {
        "command": "python -m benchmarks.mixers.speed "
        + f"--contexts {' '.join(map(str, args.contexts))} --rounds {args.rounds}",
        "machine": info,
        "load_before": load_before,
        "load_after": [round(x, 1) for x in common.load_average()],
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    common.write_page(out.with_suffix(".md"), markdown(result), result["command"])
    print(markdown(result))


if __name__ == "__main__":
    main()
