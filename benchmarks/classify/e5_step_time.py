"""Where one fine-tuning step of the e5 classifier spends its time, fp32 and bf16: the step
times and their ratio, before and after the two fixes, a profiler breakdown, model FLOPs
utilisation beside Hugging Face's XLMRobertaModel, and the step's peak memory.

The step is ``--config full``'s (presets/classify_full.toml; the default trains only the top
4 blocks over kept states): every block of
multilingual-e5-small trains (d_model 384, 12 heads, d_ff 1536), 32 texts of 128 pieces (the
preset's longest batch, every text full length) as 4 micro-batches of 8 under autocast or
not, cross-entropy, the loss times the micro-batch's size backpropagated, the gradients divided
by 32 and clipped to norm 1, AdamW (torch's fused kernel, lr 3e-5), as train/engine.py runs
it; dropout 0.1, none on the attention weights (fused attention), the word table a frozen
4-bit Q4Embedding, mean pooling.

Cases, each one optimizer step, interleaved over ``--rounds`` rounds (medians):

* ``attnlab before``: the code as it was: torch's ``F.dropout``, a dropout inside each
  feed-forward layer, and, under bf16, torch's CPU flash attention in bf16 (its backward pass
  ~4x slower than in float32);
* ``attnlab after``: attnlab's dropout (layers/dropout.py), none inside the feed-forward layers
  (as transformers' BERT), and attention in float32 where the CPU backward pass runs
  (layers/attention.py); ``attention`` and ``ffn-dropout`` undo one fix each, to measure it;
* ``transformers``: ``XLMRobertaModel`` of the same shape (random weights, word table frozen,
  SDPA attention, dropout 0.1, no attention dropout) + the same mean pooling and linear head,
  the same batch, optimizer and threads.

Workers (one process each, alive through the rounds, so the rounds alternate between them):
``--threads`` threads with the OpenMP runtime's defaults (the main job's setting); the same
with ``OMP_WAIT_POLICY=PASSIVE`` (threads that wait sleep instead of spinning); one thread,
whose process CPU time does not count the time the process waits for a core, and which runs
``torch.profiler`` over one step of each attnlab case (self time of each operator, grouped).

Model FLOPs of a step (PaLM's count, Chowdhery et al. 2022, appendix B): 6 N D for the N
weights in matmuls over D tokens (forward 2 N D, backward 4 N D), plus attention's two T x T
products, 12 L T d per token (non-causal: the full square); embeddings, norms, softmax and the
optimizer are not counted. MFU = model FLOPs / step time / peak, the peak being the best
rate of a 2048 x 2048 matmul measured in the same worker and rounds (fp32 for fp32 steps, bf16
for bf16 ones).

Memory: a fresh interpreter per case loads the encoder, builds the classifier and AdamW, and
measures the peak resident set (VmHWM) over two steps against the resident set before them
(Linux).

    python -m benchmarks.classify.e5_step_time [--rounds 5] [--threads 2]
        -> docs/results/e5_step_time.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.common import command_line, load_average, machine, machine_line, write_results

STEM = "e5_step_time"
STEP_TEXTS, MICRO, LENGTH = 32, 8, 128
ATTNLAB = ("attnlab/fp32/before", "attnlab/bf16/before", "attnlab/fp32/after", "attnlab/bf16/after")
ONE_FIX = ("attnlab/bf16/attention",)  # the attention fix alone (the dropout as before)
NOT_FIXES = (  # one fix undone, and what the recipe could change, measured for the record
    "attnlab/fp32/ffn-dropout",
    "attnlab/bf16/ffn-dropout",
    "attnlab/fp32/micro-32",
    "attnlab/bf16/micro-32",
)
HF = ("transformers/fp32", "transformers/bf16")
PEAK_N = 2048
# operator -> group of the profiler breakdown (self time); anything else is "other". Casts and
# in-place adds are split by shape: a weight's shape makes "weight casts" (autocast's per
# micro-batch copy of a weight, and its gradient cast back) and "gradient accumulation".
GROUPS = {
    "matmuls": ("aten::mm", "aten::addmm", "aten::bmm"),
    "attention kernel": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                         "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
    "dropout masks": ("aten::bernoulli_", "aten::random_", "aten::ge"),
    "weight casts": (),
    "activation casts": ("aten::copy_", "aten::_to_copy"),
    "gradient accumulation": (),
    "GELU": ("aten::gelu", "aten::gelu_backward"),
    "LayerNorm": ("aten::native_layer_norm", "aten::native_layer_norm_backward"),
    "Q4 word table": ("aten::bitwise_and", "aten::__rshift__", "aten::index", "aten::cat",
                      "aten::sub"),
    "loss": ("aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::nll_loss_forward",
             "aten::nll_loss_backward"),
    "optimizer and clipping": ("aten::_fused_adamw_", "aten::_foreach_norm",
                               "aten::_foreach_mul_", "aten::linalg_vector_norm"),
    "other element-wise": ("aten::mul", "aten::add", "aten::div_", "aten::add_", "aten::mul_",
                           "aten::sum", "aten::div", "aten::fill_", "aten::where"),
}  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (each case once a round)")
    p.add_argument("--threads", type=int, default=2, help="threads of the main workers")
    p.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory processes (4 x ~1 min)"
    )
    p.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--memory-case", default="", help=argparse.SUPPRESS)
    return p


# ----------------------------------------------------------------------------- in a worker


def _build(hf: bool):
    """(model, optimizer) of one side, seeded; the attnlab side is the e5 classifier."""
    import torch
    from torch import nn

    from attnlab.models.bert import BertClassifier, mean_pool
    from attnlab.models.e5 import load_e5
    from attnlab.train.optim import build_optimizer

    torch.manual_seed(0)
    if not hf:
        encoder, _ = load_e5()
        cfg = encoder.cfg.__class__(**{**vars(encoder.cfg), "attn_dropout": 0.0})
        model = BertClassifier(cfg, 2, "mean")
        model.bert.load_state_dict(encoder.state_dict(), strict=False)
        model.bert.pooler.requires_grad_(False)  # unused with mean pooling, as the task does
    else:
        from transformers import XLMRobertaConfig, XLMRobertaModel

        hf_cfg = XLMRobertaConfig(
            vocab_size=250037, hidden_size=384, num_hidden_layers=12, num_attention_heads=12,
            intermediate_size=1536, max_position_embeddings=514, type_vocab_size=1,
            layer_norm_eps=1e-12, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0,
            pad_token_id=1, attn_implementation="sdpa",
        )  # fmt: skip

        class HFClassifier(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.roberta = XLMRobertaModel(hf_cfg, add_pooling_layer=False)
                self.roberta.embeddings.word_embeddings.requires_grad_(False)  # frozen, as ours
                self.dropout = nn.Dropout(0.1)
                self.head = nn.Linear(384, 2)

            def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
                keep = torch.arange(ids.shape[1])[None, :] < lengths[:, None]  # (B, T)
                hidden = self.roberta(input_ids=ids, attention_mask=keep.long()).last_hidden_state
                return self.head(self.dropout(mean_pool(hidden, lengths)))  # (B, 2)

        model = HFClassifier()
    model.train()
    return model, build_optimizer(model, 3e-5, 0.01, (0.9, 0.999))


def _batch():
    import torch

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 250000, (STEP_TEXTS, LENGTH), generator=gen)  # (32, 128)
    lengths = torch.full((STEP_TEXTS,), LENGTH)
    labels = torch.randint(0, 2, (STEP_TEXTS,), generator=gen)
    return ids, lengths, labels


def _code(model, code: str) -> None:
    """Set the attnlab model's code: ``before`` (torch's dropout, attention in the autocast
    dtype, a dropout inside each feed-forward layer), ``attention`` (the attention fix alone),
    ``ffn-dropout`` (today's code with the feed-forward layers' dropout back), anything else as
    it is now (no dropout inside the feed-forward layers, as transformers' BERT)."""
    import torch

    import attnlab.layers.attention as attention
    from attnlab.layers.blocks import FeedForward
    from attnlab.layers.dropout import Dropout

    attention._upcast_on_cpu = (lambda *a: False) if code == "before" else _UPCAST[0]
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.__class__ = torch.nn.Dropout if code in ("before", "attention") else Dropout
            m.p = 0.1
    for m in model.modules():
        if isinstance(m, FeedForward):
            m.dropout.p = 0.1 if code in ("before", "attention", "ffn-dropout") else 0.0


_UPCAST: list[Any] = []


def _step(model, opt, batch, dtype, micro: int = MICRO) -> None:
    """One optimizer step as the engine takes it (micro-batches, weighting, clip, AdamW)."""
    import torch
    import torch.nn.functional as F

    from attnlab.train.precision import autocast

    ids, lengths, labels = batch
    cpu = torch.device("cpu")
    for i in range(0, STEP_TEXTS, micro):
        part = slice(i, i + micro)
        with autocast(cpu, dtype):
            loss = F.cross_entropy(model(ids[part], lengths[part]), labels[part])
        (loss * micro).backward()
        loss.item()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    for g in grads:
        g.mul_(1 / STEP_TEXTS)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _profile(model, opt, batch, dtype) -> dict[str, float]:
    """Self seconds of one step per operator group (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    weights = [list(p.shape) for p in model.parameters() if p.requires_grad]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _step(model, opt, batch, dtype)
    out = dict.fromkeys([*GROUPS, "other"], 0.0)
    where = {op: group for group, ops in GROUPS.items() for op in ops}
    for event in prof.key_averages(group_by_input_shape=True):
        group = where.get(event.key, "other")
        of_weight = bool(event.input_shapes) and event.input_shapes[0] in weights
        if group == "activation casts" and of_weight:
            group = "weight casts"
        elif event.key == "aten::add_" and of_weight:
            group = "gradient accumulation"
        out[group] += event.self_cpu_time_total / 1e6
    out["total"] = sum(out.values())
    return out


def _peak(dtype) -> float:
    """Seconds of one PEAK_N^3 matmul in ``dtype``."""
    import torch

    a = torch.randn(PEAK_N, PEAK_N).to(dtype)
    b = torch.randn(PEAK_N, PEAK_N).to(dtype)
    a @ b
    start = time.perf_counter()
    a @ b
    return time.perf_counter() - start


def worker(threads: int) -> None:
    """Answer one JSON command a line on stdin: step, profile, peak, quit."""
    import torch

    import attnlab.layers.attention as attention

    torch.set_num_threads(threads)
    _UPCAST.append(attention._upcast_on_cpu)
    dtypes = {"fp32": None, "bf16": torch.bfloat16}
    batch = _batch()
    sides: dict[str, tuple] = {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "peak":
            wall = _peak(torch.float32 if cmd["dtype"] == "fp32" else torch.bfloat16)
            print(json.dumps({"wall": wall}), flush=True)
            continue
        side, precision, *code = cmd["case"].split("/")
        if side not in sides:
            sides[side] = _build(side == "transformers")
        model, opt = sides[side]
        if side == "attnlab":
            _code(model, code[0])
        if cmd["op"] == "profile":
            print(json.dumps(_profile(model, opt, batch, dtypes[precision])), flush=True)
            continue
        micro = 32 if code == ["micro-32"] else MICRO
        c0, t0 = time.process_time(), time.perf_counter()
        _step(model, opt, batch, dtypes[precision], micro)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)


def memory_case(case: str, threads: int) -> None:
    """Print the resident set once the model and optimizer are built, and the peak over the
    first two steps (MiB), in a fresh process."""
    import torch

    import attnlab.layers.attention as attention

    def status(key: str) -> float:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
        raise KeyError(key)

    torch.set_num_threads(threads)
    _UPCAST.append(attention._upcast_on_cpu)
    _, precision, code = case.split("/")
    model, opt = _build(hf=False)
    _code(model, code)
    dtype = None if precision == "fp32" else torch.bfloat16
    micro = 32 if code == "micro-32" else MICRO
    batch = _batch()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS: the loading's own peak is not the step's
    base = status("VmRSS")
    for _ in range(2):  # the first creates AdamW's moments, the second runs with them
        _step(model, opt, batch, dtype, micro)
    peak = status("VmHWM")
    print(json.dumps({"base_mib": base, "peak_mib": peak, "steps_add_mib": peak - base}))


# ----------------------------------------------------------------------------- the parent


class Worker:
    """A worker process driven one command at a time."""

    def __init__(self, name: str, threads: int, env: dict[str, str], cases: Sequence[str]):
        self.name, self.threads, self.cases = name, threads, list(cases)
        argv = [sys.executable, "-m", "benchmarks.classify.e5_step_time", "--worker", str(threads)]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.read()  # ready

    def ask(self, **cmd: Any) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} ended (exit {self.proc.wait()})")
        return json.loads(line)

    def ask_quit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
        self.proc.stdin.flush()
        self.proc.wait()


def model_flops() -> dict[str, float]:
    """PaLM's model FLOPs of one step (module docstring), from the architecture."""
    d, d_ff, layers, classes = 384, 1536, 12, 2
    n_matmul = layers * (4 * d * d + 2 * d * d_ff) + d * classes  # q, k, v, out; FFN; head
    tokens = STEP_TEXTS * LENGTH
    dense = 6 * n_matmul * tokens
    attention = 12 * layers * LENGTH * d * tokens  # 3 x (QK^T and PV: 2 x 2 T d per token)
    return {"matmul_weights": n_matmul, "tokens": tokens, "dense": dense,
            "attention": attention, "total": dense + attention}  # fmt: skip


def measure(args: argparse.Namespace) -> dict[str, Any]:
    base = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    base.pop("OMP_WAIT_POLICY", None)
    workers = [
        Worker(f"{args.threads} threads", args.threads, base, [*ATTNLAB, *ONE_FIX, *HF]),
        Worker(
            f"{args.threads} threads, OMP_WAIT_POLICY=PASSIVE",
            args.threads,
            base | {"OMP_WAIT_POLICY": "PASSIVE"},
            [*ATTNLAB[2:], *HF],
        ),
        Worker("1 thread", 1, base, [*ATTNLAB, *ONE_FIX, *NOT_FIXES]),
    ]
    times: dict[str, dict[str, list[dict]]] = {w.name: {c: [] for c in w.cases} for w in workers}
    peaks: dict[str, dict[str, list[float]]] = {w.name: {"fp32": [], "bf16": []} for w in workers}
    profiles: dict[str, list[dict]] = {c: [] for c in ATTNLAB}
    try:
        for w in workers:  # warm-up: build both sides, one untimed step of each case
            for case in w.cases:
                w.ask(op="step", case=case)
        for r in range(args.rounds):
            for w in workers:
                order = w.cases if r % 2 == 0 else w.cases[::-1]
                for case in order:
                    times[w.name][case].append(w.ask(op="step", case=case))
                for dt in ("fp32", "bf16"):
                    peaks[w.name][dt].append(w.ask(op="peak", dtype=dt)["wall"])
            for case in ATTNLAB if r < 3 else ():  # three profiled steps of each, one thread
                profiles[case].append(workers[-1].ask(op="profile", case=case))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for w in workers:
            w.ask_quit()
    flops = model_flops()
    out: dict[str, Any] = {"flops": flops, "workers": {}}
    for w in workers:
        peak = {dt: 2 * PEAK_N**3 / min(ts) / 1e9 for dt, ts in peaks[w.name].items()}
        rows = {}
        for case, runs in times[w.name].items():
            wall = statistics.median(x["wall"] for x in runs)
            cpu = statistics.median(x["cpu"] for x in runs)
            dt = "bf16" if "/bf16" in case else "fp32"
            spent = cpu if w.threads == 1 else wall  # one thread: the time it computed
            rows[case] = {
                "wall_s": round(wall, 3),
                "cpu_s": round(cpu, 3),
                "wall_runs": [round(x["wall"], 3) for x in runs],
                "tflops": round(flops["total"] / spent / 1e12, 4),
                "mfu": round(flops["total"] / spent / 1e9 / peak[dt], 4),
            }
        out["workers"][w.name] = {
            "threads": w.threads,
            "peak_gflops": {k: round(v, 1) for k, v in peak.items()},
            "cases": rows,
        }
    out["profile_1_thread"] = {}
    for case, ps in profiles.items():  # a process that waits for a core only adds time: min
        groups = {k: min(p[k] for p in ps) for k in ps[0] if k != "total"}
        out["profile_1_thread"][case] = {k: round(v, 3) for k, v in groups.items()} | {
            "total": round(sum(groups.values()), 3)
        }
    return out


def measure_memory(threads: int) -> dict[str, dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = {}
    for case in (*ATTNLAB, *NOT_FIXES[2:]):
        argv = [sys.executable, "-m", "benchmarks.classify.e5_step_time", "--memory-case", case,
                "--worker", str(threads)]  # fmt: skip
        run = subprocess.run(argv, check=True, capture_output=True, text=True, env=env)
        out[case] = {k: round(v) for k, v in json.loads(run.stdout.splitlines()[-1]).items()}
    return out


def _ratio(rows: dict, a: str, b: str, key: str = "wall_s") -> str:
    return f"{rows[a][key] / rows[b][key]:.2f}x"


def page(info: dict, res: dict, args: argparse.Namespace) -> list[str]:
    flops = res["flops"]
    lines = [
        "# One fine-tuning step of the e5 classifier: fp32 against bf16, before and after",
        "",
        machine_line(info),
        f"CPU flags: {info['bf16_flags']} (AMX: {'yes' if 'amx_bf16' in info['bf16_flags'] else 'no'}). "  # noqa: E501
        "The host is shared: the load averages above say how busy it was.",
        "",
        f"One optimizer step of `--config full`: {STEP_TEXTS} texts x {LENGTH} pieces as "
        f"{STEP_TEXTS // MICRO} micro-batches of {MICRO}, forward, backward, clipping and AdamW "
        f"(the script's docstring says exactly what). {args.rounds} rounds, every case once a "
        "round, the workers' rounds interleaved; medians. *Before*: torch's dropout, a dropout "
        "inside each feed-forward layer and, under bf16, attention in bf16 (the code before "
        "this page); *after*: attnlab's dropout, none inside the feed-forward layers (as "
        "transformers' BERT) and attention in float32 where the CPU's backward pass runs.",
        "",
    ]
    for name, w in res["workers"].items():
        rows = w["cases"]
        clock = "process CPU time" if w["threads"] == 1 else "wall time"
        lines += [f"## {name}", ""]
        lines += [f"| case | step s (wall) | process CPU s | model TFLOP/s ({clock}) | MFU |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for case, r in rows.items():
            lines.append(
                f"| {case} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['tflops']:.3f} | "
                f"{100 * r['mfu']:.1f}% |"
            )
        ratios = []
        for code in ("before", "after"):
            a, b = f"attnlab/fp32/{code}", f"attnlab/bf16/{code}"
            if a in rows and b in rows:
                key = "cpu_s" if w["threads"] == 1 else "wall_s"
                ratios.append(f"{code}: bf16 step {_ratio(rows, a, b, key)} the fp32 step")
        if "transformers/fp32" in rows:
            ratios.append(f"transformers: {_ratio(rows, 'transformers/fp32', 'transformers/bf16')}")
        lines += [
            "",
            "Speed-up of bf16 over fp32 "
            f"({'process CPU time' if w['threads'] == 1 else 'wall time'}): "
            + "; ".join(ratios)
            + f". Peak of a {PEAK_N}^3 matmul here: fp32 {w['peak_gflops']['fp32']:.0f} "
            f"GFLOP/s, bf16 {w['peak_gflops']['bf16']:.0f} GFLOP/s (best of the rounds).",
            "",
        ]
    one = res["workers"]["1 thread"]["cases"]

    def saved(a: str, b: str) -> str:
        cut = one[f"attnlab/{a}"]["cpu_s"] - one[f"attnlab/{b}"]["cpu_s"]
        return f"{cut:.2f} s ({100 * cut / one[f'attnlab/{a}']['cpu_s']:.0f}%)"

    lines += [
        "## Causes, measured (one thread, process CPU time of a step)",
        "",
        "What each change takes off the step, as a share of the step it is taken from.",
        "",
        "| cause | fp32 step | bf16 step | fixed |",
        "|---|---|---|---|",
        f"| bf16 attention backward (torch's CPU flash kernel) | - | "
        f"{saved('bf16/before', 'bf16/attention')} | yes: float32 attention where it trains |",
        f"| dropout masks by bernoulli_ | {saved('fp32/before', 'fp32/ffn-dropout')} | "
        f"{saved('bf16/attention', 'bf16/ffn-dropout')} | yes: 32-bit integer draws |",
        f"| a dropout inside each feed-forward layer, which transformers' BERT does not have | "
        f"{saved('fp32/ffn-dropout', 'fp32/after')} | "
        f"{saved('bf16/ffn-dropout', 'bf16/after')} | yes: BERT's layers drop where "
        "transformers' do |",
        f"| micro-batches of 8 instead of 32 | {saved('fp32/after', 'fp32/micro-32')} | "
        f"{saved('bf16/after', 'bf16/micro-32')} | no: the preset's, for memory |",
        "",
    ]
    prof = res["profile_1_thread"]
    lines += [
        "## Where the step's time goes (torch.profiler, one thread)",
        "",
        "Self time of the operators of one step (the profiler's clock is the wall clock), "
        "grouped; for each group the least of three profiled steps, as waiting for a core only "
        "adds time. The profiler's own cost is included, so the totals exceed the timings "
        "above.",
        "",
        "| group | " + " | ".join(prof) + " |",
        "|---|" + "---|" * len(prof),
    ]
    for group in [*GROUPS, "other", "total"]:
        cells = []
        for case in prof:
            s, total = prof[case][group], prof[case]["total"]
            cells.append(f"{s:.2f} s" + ("" if group == "total" else f" ({100 * s / total:.0f}%)"))
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Model FLOPs",
        "",
        f"{flops['matmul_weights']:,} weights in matmuls (12 x (4 x 384^2 + 2 x 384 x 1536) + "
        f"384 x 2) over {flops['tokens']:,} tokens: 6 N D = {flops['dense'] / 1e9:.1f} GFLOP; "
        f"attention 12 L T d D = {flops['attention'] / 1e9:.1f} GFLOP; "
        f"{flops['total'] / 1e9:.1f} GFLOP a step. MFU = that / step time / the matmul peak of "
        "the same worker and precision.",
        "",
    ]
    if res.get("memory"):
        lines += [
            "## Memory of a step",
            "",
            "Fresh process per case: the encoder loaded, the classifier and AdamW built (the "
            "resident set then), two steps taken (the first creates AdamW's moments); the peak "
            "resident set over the two steps (VmHWM, reset once the model was built). The main "
            "job's whole run adds its data, tokenizer and evaluations.",
            "",
            "| case | resident once built MiB | peak over two steps MiB | the steps add MiB |",
            "|---|---|---|---|",
        ]
        for case, m in res["memory"].items():
            lines.append(
                f"| {case} | {m['base_mib']:,} | {m['peak_mib']:,} | {m['steps_add_mib']:,} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.memory_case:
        memory_case(args.memory_case, args.worker)
        return
    if args.worker:
        worker(args.worker)
        return
    from attnlab.train.precision import cpu_bf16_flag_names

    info = machine(threads=args.threads, bf16_flags=" ".join(cpu_bf16_flag_names()) or "none")
    res = measure(args)
    if not args.no_memory:
        res["memory"] = measure_memory(args.threads)
    info["load_average_at_end"] = load_average()
    write_results(
        STEM,
        {"machine": info, "args": vars(args), **res},
        page(info, res, args),
        command=command_line(argv),
    )


if __name__ == "__main__":
    main()
