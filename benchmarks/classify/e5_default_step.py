"""The main job's own training step, fp32 against bf16: its real batches, where the time goes,
model FLOPs utilisation beside transformers' layers on the same batches.

The default (presets/classify.toml) trains the top 4 blocks of multilingual-e5-small over the
kept output of the 8 below, 32 texts a step as two micro-batches of 16, each padded to its
longest text (16 to 128 pieces: most of the default's batches are 32 or 48 long).
docs/results/e5_step_time.md times ``--config full``'s step (all 12 blocks, 128 pieces); this
page times the default's.

The script builds the default run's training data in this process as ``attnlab train
classify`` does (the task's setup and recipe: the frozen pass, label cleaning, the turned
sentences, the LP-FT probe; about 2-3 minutes), then takes ``--steps`` of its optimizer steps,
drawn at random (seed 0) from the epoch's, the same ones for every case:

* ``attnlab fp32``, ``attnlab bf16``: the step as train/engine.py takes it (one autocast
  context around both micro-batches' forward passes, each backward in a nested context with
  autocast off, gradients divided by the step's texts, clipping to norm 1, fused AdamW); under
  bf16 autocast's cache of cast weights, dropped when its outermost context exits, serves both
  micro-batches, so each trained weight is cast to bf16 once a step;
* ``attnlab bf16, weights cast each micro-batch``: an autocast context around each
  micro-batch's forward instead, as the engine took the step before: what the casts saved;
* ``transformers fp32``, ``transformers bf16``: 4 ``XLMRobertaLayer``s of the same shape
  (random weights, SDPA attention, dropout 0.1, none on the attention weights) on the same
  kept states with the same mean pooling, dropout and linear head, the same optimizer.

Cases alternate step by step (the order reversed every other step); each case's time is the sum
over the steps. Then ``torch.profiler`` over ``--profile-steps`` steps of the two attnlab cases:
self time per operator group.

Model FLOPs (PaLM's count, Chowdhery et al. 2022, appendix B): 6 N per token for the N weights
in matmuls (forward 2 N, backward 4 N), plus attention's two T x T products, 12 L T d per
token, over every position of the padded micro-batches (padding is computed too); norms,
softmax, dropout and the optimizer not counted. MFU = model FLOPs / step time / the best rate
of a 2048^3 matmul in the same precision, measured in the same process.

    python -m benchmarks.classify.e5_default_step [--steps 40] [--threads 2]
        -> docs/results/e5_default_step.{json,md}
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import command_line, load_average, machine, machine_line, write_results

STEM = "e5_default_step"
PEAK_N = 2048
GROUPS = {
    "matmuls": ("aten::mm", "aten::addmm", "aten::bmm"),
    "attention kernel (float32)": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                                   "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
    "casts and copies": ("aten::copy_", "aten::_to_copy"),
    "dropout masks": ("aten::random_", "aten::ge"),
    "GELU": ("aten::gelu", "aten::gelu_backward"),
    "LayerNorm": ("aten::native_layer_norm", "aten::native_layer_norm_backward"),
    "optimizer and clipping": ("aten::_fused_adamw_", "aten::_foreach_norm",
                               "aten::_foreach_mul_", "aten::linalg_vector_norm"),
    "other element-wise": ("aten::mul", "aten::add", "aten::div_", "aten::add_", "aten::mul_",
                           "aten::sum", "aten::div", "aten::fill_", "aten::where"),
}  # fmt: skip
CASES = (
    "attnlab fp32",
    "attnlab bf16",
    "attnlab bf16, weights cast each micro-batch",
    "transformers fp32",
    "transformers bf16",
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps timed per case")
    p.add_argument("--profile-steps", type=int, default=10, help="steps under the profiler")
    p.add_argument("--threads", type=int, default=2, help="torch threads (the main job's: 2)")
    return p


def default_run(threads: int) -> tuple[nn.Module, Any, int]:
    """The default run's model after its recipe (LP-FT head, lower blocks frozen), its
    training data (kept states) and the number of blocks below the trained ones."""
    from attnlab.runs.training import build_config
    from attnlab.tasks.classify import TASK
    from attnlab.train import seed_everything

    torch.set_num_threads(threads)
    cfg = build_config("classify", None, {})
    with tempfile.TemporaryDirectory() as work:
        setup = TASK.setup(cfg, Path(work), False, "cpu")
        seed_everything(cfg.train.seed)
        model = TASK.build_model(cfg, setup)
    return model, setup.train_data, setup.train_data.start


class HFTop(nn.Module):
    """transformers' XLMRobertaLayer x ``layers`` on kept states, mean pooling, dropout, head."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        from transformers import XLMRobertaConfig
        from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaLayer

        self.cfg = XLMRobertaConfig(
            hidden_size=384, num_hidden_layers=layers, num_attention_heads=12,
            intermediate_size=1536, layer_norm_eps=1e-12, hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.0, attn_implementation="sdpa",
        )  # fmt: skip
        self.layers = nn.ModuleList(XLMRobertaLayer(self.cfg) for _ in range(layers))
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(384, 2)

    def forward(self, hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_bidirectional_mask

        keep = torch.arange(hidden.shape[1])[None, :] < lengths[:, None]  # (B, T)
        mask = create_bidirectional_mask(
            config=self.cfg, inputs_embeds=hidden, attention_mask=keep.long()
        )
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=mask)  # (B, T, D)
        kept = keep[..., None].to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * kept).sum(1) / lengths[:, None].to(hidden.dtype)  # (B, D)
        return self.head(self.dropout(pooled))  # (B, 2)


def step_runner(
    model: nn.Module, forward: Callable[[nn.Module, dict], torch.Tensor]
) -> Callable[[list[dict], torch.dtype | None, bool], None]:
    """One optimizer step over micro-batches as train/engine.py takes it."""
    from attnlab.train.optim import build_optimizer
    from attnlab.train.precision import autocast, autocast_off

    opt = build_optimizer(model, 5e-5, 0.01, (0.9, 0.999))
    cpu = torch.device("cpu")

    def run(micro: list[dict], dtype: torch.dtype | None, cast_once: bool) -> None:
        model.train()
        n = sum(len(b["labels"]) for b in micro)
        once = cast_once and dtype is not None
        with autocast(cpu, dtype) if once else contextlib.nullcontext():
            for batch in micro:
                with contextlib.nullcontext() if once else autocast(cpu, dtype):
                    loss = F.cross_entropy(forward(model, batch), batch["labels"])
                off = autocast_off(cpu, dtype) if once else contextlib.nullcontext()
                with off:  # a nested context keeps the outer one's cache of cast weights
                    (loss * len(batch["labels"])).backward()
                loss.item()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(1 / n)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return run


def model_flops(micro: list[dict], layers: int) -> float:
    """PaLM's model FLOPs of one step over the padded micro-batches (module docstring)."""
    d, d_ff = 384, 1536
    n_matmul = layers * (4 * d * d + 2 * d * d_ff) + d * 2
    total = 0.0
    for batch in micro:
        B, T = batch["hidden"].shape[:2]
        total += B * T * (6 * n_matmul + 12 * layers * T * d)
    return total


def peak_gflops(dtype: torch.dtype) -> float:
    a, b = torch.randn(PEAK_N, PEAK_N).to(dtype), torch.randn(PEAK_N, PEAK_N).to(dtype)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(5))
    return 2 * PEAK_N**3 / best / 1e9


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict[str, Any]:
    model, data, start = default_run(args.threads)
    layers = len(model.bert.encoder.blocks) - start
    batches = data.batches(0)
    groups = [batches[i : i + 2] for i in range(0, len(batches) - 1, 2)]
    chosen = random.Random(0).sample(range(len(groups)), args.steps + 1)
    steps = [[data.collate(ix) for ix in groups[g]] for g in chosen]
    lengths = sorted(b["hidden"].shape[1] for s in steps for b in s)

    def ours(m: nn.Module, batch: dict) -> torch.Tensor:
        return m(None, batch["lengths"], hidden=batch["hidden"], start=batch["start"])

    torch.manual_seed(0)
    hf = HFTop(layers)
    runners = {
        "attnlab": step_runner(model, ours),
        "transformers": step_runner(hf, lambda m, b: m(b["hidden"], b["lengths"])),
    }
    bf16 = torch.bfloat16

    def run(case: str, micro: list[dict]) -> None:
        side, precision = case.split(" ")[:2]
        runners[side](micro, None if precision == "fp32" else bf16, "each" not in case)

    for case in CASES:  # warm-up: allocator, kernels, AdamW's moments
        run(case.replace(",", ""), steps[0])
    seconds = dict.fromkeys(CASES, 0.0)
    for i, micro in enumerate(steps[1:]):
        for case in CASES if i % 2 == 0 else CASES[::-1]:
            seconds[case] += _timed(lambda c=case, m=micro: run(c.replace(",", ""), m))
        if (i + 1) % 10 == 0:
            print(f"step {i + 1}/{args.steps} timed", file=sys.stderr, flush=True)
    peaks = {"fp32": peak_gflops(torch.float32), "bf16": peak_gflops(bf16)}
    flops = sum(model_flops(m, layers) for m in steps[1:])
    cases = {}
    for case, s in seconds.items():
        precision = case.split(" ")[1].rstrip(",")
        cases[case] = {
            "ms_per_step": round(1000 * s / args.steps, 1),
            "tflops": round(flops / s / 1e12, 4),
            "mfu": round(flops / s / 1e9 / peaks[precision], 4),
        }
    attention = _attention_dtypes((32, 48, 64, 128))
    micro_32 = _one_micro_batch(args, model, data, steps, lambda c, m: run(c, m))
    profile = {case: _profile(lambda m, c=case: run(c, m), steps[1 : 1 + args.profile_steps])
               for case in ("attnlab fp32", "attnlab bf16")}  # fmt: skip
    return {
        "layers_trained": layers,
        "steps": args.steps,
        "micro_batch_lengths": {str(t): lengths.count(t) for t in sorted(set(lengths))},
        "gflop_per_step": round(flops / args.steps / 1e9, 2),
        "peak_gflops": {k: round(v, 1) for k, v in peaks.items()},
        "cases": cases,
        "profile_ms_per_step": profile,
        "one_micro_batch_of_32": micro_32,
        "attention_ms": attention,
    }


def _one_micro_batch(
    args: argparse.Namespace, model: nn.Module, data: Any, steps: list[list[dict]], run: Callable
) -> dict[str, float]:
    """Microseconds per real token of the default's steps (two micro-batches of 16) against
    steps of one micro-batch of 32 drawn from a sampler of 32 over the same texts (other steps,
    so the comparison is per token), fp32 and bf16, and bf16 with the trained blocks' attention
    written out (backend "explicit"), alternating."""
    from attnlab.data.buckets import LengthBucketSampler
    from attnlab.data.states import StateData
    from attnlab.layers.attention import MultiHeadAttention

    attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]

    lengths = [s.shape[0] for s in data.states]
    wide = StateData(data.states, data.labels, LengthBucketSampler(lengths, 32, True, 0),
                     data.start)  # fmt: skip
    batches = wide.batches(0)
    chosen = random.Random(0).sample(range(len(batches)), args.steps)
    sides = {"16x2": steps[1:], "32x1": [[wide.collate(batches[g])] for g in chosen]}
    cases = [(side, precision) for side in sides for precision in ("fp32", "bf16")]
    cases.append(("32x1", "bf16, attention written out"))
    seconds = dict.fromkeys(cases, 0.0)
    for i in range(args.steps):
        for side, precision in cases if i % 2 == 0 else cases[::-1]:
            micro, case = sides[side][i], "attnlab " + precision.split(",")[0]
            for m in attention:
                m.backend = "explicit" if "written out" in precision else "fused"
            seconds[side, precision] += _timed(lambda m=micro, c=case: run(c, m))
    for m in attention:
        m.backend = "fused"
    tokens = {
        side: sum(int(b["lengths"].sum()) for st in ss for b in st) for side, ss in sides.items()
    }
    return {f"{side} {precision}": round(1e6 * s / tokens[side], 1)
            for (side, precision), s in seconds.items()}  # fmt: skip


def _attention_dtypes(lengths: Sequence[int], repeats: int = 12) -> dict[str, dict[str, float]]:
    """Milliseconds of one attention call's forward and backward, as a trained block of the
    default runs it (16 texts, 12 heads of 32, a key mask), the median of ``repeats``:

    ``fp32``        torch's fused CPU kernel on float32 inputs;
    ``bf16``        the same kernel on bf16 inputs;
    ``attnlab``     attnlab's attention (layers/attention.py) on bf16 inputs, as a bf16 step
                    calls it: the fused kernel in float32, the inputs cast up, the output down;
    ``written out`` attnlab's explicit_attention (Q Kᵀ, softmax, · V as three operations)
                    under bf16 autocast: the two products in bf16, the softmax in float32."""
    from attnlab.layers.attention import explicit_attention, scaled_dot_product_attention

    def fused(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def attnlab(q, k, v, mask):
        return scaled_dot_product_attention(q, k, v, mask)[0]

    def written_out(q, k, v, mask):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return explicit_attention(q, k, v, mask)[0]

    cases = (
        ("fp32", torch.float32, fused),
        ("bf16", torch.bfloat16, fused),
        ("attnlab", torch.bfloat16, attnlab),
        ("written out", torch.bfloat16, written_out),
    )
    out = {}
    for T in lengths:
        gen = torch.Generator().manual_seed(T)
        qkv = [torch.randn(16, 12, T, 32, generator=gen) for _ in range(3)]
        mask = torch.ones(16, 1, 1, T, dtype=torch.bool)
        mask[:4, ..., T // 2 :] = False  # a quarter of the texts half as long
        row = {}
        for name, dtype, attend in cases:
            q, k, v = (t.to(dtype).requires_grad_() for t in qkv)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                attend(q, k, v, mask).float().sum().backward()
                times.append(time.perf_counter() - start)
            row[name] = round(1000 * sorted(times)[repeats // 2], 2)
        out[str(T)] = row
    return out


def _profile(run: Callable[[list[dict]], None], steps: Sequence[list[dict]]) -> dict[str, float]:
    """Self milliseconds per step of each operator group (torch.profiler, wall clock)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for micro in steps:
            run(micro)
    out = dict.fromkeys([*GROUPS, "other"], 0.0)
    where = {op: group for group, ops in GROUPS.items() for op in ops}
    for event in prof.key_averages():
        out[where.get(event.key, "other")] += event.self_cpu_time_total / 1e3 / len(steps)
    out["total"] = sum(out.values())
    return {k: round(v, 1) for k, v in out.items()}


def page(info: dict, res: dict, args: argparse.Namespace) -> list[str]:
    cases = res["cases"]
    fp32, bf16 = cases["attnlab fp32"]["ms_per_step"], cases["attnlab bf16"]["ms_per_step"]
    each = cases["attnlab bf16, weights cast each micro-batch"]["ms_per_step"]
    hf32 = cases["transformers fp32"]["ms_per_step"]
    hf16 = cases["transformers bf16"]["ms_per_step"]
    lengths = ", ".join(f"{t}: {n}" for t, n in res["micro_batch_lengths"].items())
    m32 = res["one_micro_batch_of_32"]
    lines = [
        "# The main job's own training step: fp32 against bf16",
        "",
        machine_line(info),
        f"CPU flags: {info['bf16_flags']} (AMX: "
        f"{'yes' if 'amx_bf16' in info['bf16_flags'] else 'no'}). The host is shared: the load "
        "averages above say how busy it was.",
        "",
        f"The default's step: the top {res['layers_trained']} blocks of multilingual-e5-small "
        "over the kept output of the blocks below, 32 texts as two micro-batches of 16 padded "
        f"to their longest text. {res['steps']} of the default run's own steps, drawn at "
        "random, the same for every case, the cases alternating step by step; milliseconds a "
        f"step (the mean). Lengths of their micro-batches (pieces: count): {lengths}. Model "
        f"FLOPs {res['gflop_per_step']:.1f} GFLOP a step (the script's docstring says how they "
        "are counted).",
        "",
        "| case | ms a step | model TFLOP/s | MFU |",
        "|---|---|---|---|",
    ]
    for case, r in cases.items():
        lines.append(
            f"| {case} | {r['ms_per_step']:.0f} | {r['tflops']:.3f} | {100 * r['mfu']:.1f}% |"
        )
    lines += [
        "",
        f"bf16 step {fp32 / bf16:.2f}x the fp32 step (weights cast each micro-batch: "
        f"{fp32 / each:.2f}x); transformers' layers: {hf32 / hf16:.2f}x. attnlab's step "
        f"against transformers': fp32 {hf32 / fp32:.2f}x, bf16 {hf16 / bf16:.2f}x as fast. "
        f"Peak of a {PEAK_N}^3 matmul here: fp32 {res['peak_gflops']['fp32']:.0f} GFLOP/s, "
        f"bf16 {res['peak_gflops']['bf16']:.0f} GFLOP/s.",
        "",
        "## One micro-batch of 32 instead of two of 16",
        "",
        f"The default's steps against {args.steps} steps of one micro-batch of 32 drawn from a "
        "length-bucketed sampler of 32 over the same texts; other steps, so time per real "
        "(unpadded) token, the cases alternating step by step; the last row runs the trained "
        "blocks' attention written out (explicit_attention under autocast, below) instead of "
        "the fused kernel in float32, against the fp32 step of the same micro-batches.",
        "",
        "| micro-batches | precision | us a token | faster than fp32 by |",
        "|---|---|---|---|",
        *[
            f"| {key.split(' ', 1)[0]} | {key.split(' ', 1)[1]} | {us:.1f} | "
            f"{m32[key.split(' ')[0] + ' fp32'] / us:.2f}x |"
            for key, us in m32.items()
        ],
        "",
        "## Where the step's time goes (torch.profiler)",
        "",
        f"Self time of the operators over {args.profile_steps} of the steps, grouped, "
        "milliseconds a step; the profiler's own cost is included, so the totals exceed the "
        "timings above. Attention runs in float32 under bf16 too (layers/attention.py): "
        "torch's CPU flash kernel differentiates several times slower in bf16, at these "
        "lengths too (the table below).",
        "",
        "One attention call's forward and backward as a trained block makes it (16 texts, 12 "
        "heads of 32, a key mask; milliseconds, the median of 12): torch's fused kernel on "
        "float32 and on bf16 inputs; attnlab's attention on bf16 inputs as a bf16 step calls it "
        "(the fused kernel in float32, casts around it); attention written out "
        "(explicit_attention: Q Kᵀ and · V as bf16 products under autocast, the softmax in "
        "float32), which attnlab does not use in training.",
        "",
        "| pieces | fused fp32 | fused bf16 | attnlab, bf16 step | written out, bf16 |",
        "|---|---|---|---|---|",
        *(
            f"| {T} | {r['fp32']:.2f} | {r['bf16']:.2f} | {r['attnlab']:.2f} | "
            f"{r['written out']:.2f} |"
            for T, r in res["attention_ms"].items()
        ),
        "",
        "Operators by group:",
        "",
        "| group | attnlab fp32 | attnlab bf16 | bf16 faster by |",
        "|---|---|---|---|",
    ]
    p32 = res["profile_ms_per_step"]["attnlab fp32"]
    p16 = res["profile_ms_per_step"]["attnlab bf16"]
    for group in [*GROUPS, "other", "total"]:
        ratio = f"{p32[group] / p16[group]:.2f}x" if p16[group] > 0 else "-"
        lines.append(f"| {group} | {p32[group]:.1f} | {p16[group]:.1f} | {ratio} |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from attnlab.train.precision import cpu_bf16_flag_names

    info = machine(threads=args.threads, bf16_flags=" ".join(cpu_bf16_flag_names()) or "none")
    res = measure(args)
    info["load_average_at_end"] = load_average()
    write_results(
        STEM, {"machine": info, "args": vars(args), **res}, page(info, res, args),
        command=command_line(argv),
    )  # fmt: skip


if __name__ == "__main__":
    main()
