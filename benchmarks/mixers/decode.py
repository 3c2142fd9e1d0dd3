"""Mamba against attention: decoding cost per token and training-step scaling with length.

    python -m benchmarks.mixers.decode [--max-len 4096] [--max-T 16384] [--threads 1]

1. Decoding (greedy, batch 1, no_grad, float32): ms per generated token at generated length
   L = 128 ... 4096 (median of the 16 steps before L) for attnlab's GPT with its KV cache and
   for a pure Mamba LM with its constant-size state, and the memory each holds at L (the
   cache's live keys and values, and what its buffers have allocated; the Mamba conv + SSM
   state). GPT: 4 layers, d_model 256, 4 heads, learned positions; Mamba: 8 layers (two
   Mamba layers per Transformer layer, as Gu & Dao compare them: about equal parameters),
   d_model 256, d_state 16, expand 2; RWKV: 4 layers of time-mix + channel-mix, d_model 256
   (a layer holds about as many weights as a Transformer layer). Random weights: cost does not
   depend on them.
2. Scaling: one block's forward + backward time and peak memory against T = 512 ... 16384,
   each point in a fresh process (the method of src/attnlab/bench/scaling.py: peak = rise of
   VmHWM over VmRSS; points skipped when the previous point predicts more than --time-cap
   seconds). Blocks: attnlab's pre-norm causal GPT block (d_model 256, 4 heads, d_ff 1024)
   with fused, local (window 256) or linear attention, and the same block with the Mamba
   mixer in place of attention (d_state 16, expand 2, the chunked scan). Fitted exponents of
   time and memory over T >= 1024.

Writes docs/results/ssm_decode.{json,md}; one torch thread unless --threads says otherwise; the
load average is recorded at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

from attnlab.bench.report import scaling_lines
from attnlab.bench.scaling import fit_exponent
from attnlab.layers.blocks import FeedForward
from attnlab.layers.ssm import MambaBlock
from attnlab.models.gpt import GPT, GPTConfig
from benchmarks import common

VOCAB, D_MODEL = 256, 256
ATTENTION_KINDS = ("fused", "local", "linear")


# --------------------------------------------------------------------------- decoding


def models(max_len: int) -> dict[str, nn.Module]:
    torch.manual_seed(0)
    gpt = GPT(
        GPTConfig(vocab_size=VOCAB, context=max_len + 1, n_layers=4, n_heads=4, d_model=D_MODEL)
    )
    mamba = GPT(  # Gu & Dao's Mamba LM: the mixer alone per layer, RMSNorm, tied head
        GPTConfig(
            vocab_size=VOCAB, context=max_len + 1, n_layers=8, n_heads=1, d_model=D_MODEL,
            pos="rope", norm="rms", bias=False, mixer="mamba", ffn="none",
        )
    )  # fmt: skip
    rwkv = GPT(  # RWKV-4: time-mix and channel-mix per layer, as many layers as the GPT
        GPTConfig(
            vocab_size=VOCAB,
            context=max_len + 1,
            n_layers=4,
            n_heads=4,
            d_model=D_MODEL,
            mixer="rwkv",
        )
    )
    return {"gpt_kv_cache": gpt.eval(), "mamba_state": mamba.eval(), "rwkv_state": rwkv.eval()}


def cache_bytes(caches: list) -> tuple[int, int]:
    """(live bytes, allocated bytes) held by a model's decoding caches."""
    live = alloc = 0
    for c in caches:
        if hasattr(c, "nbytes"):  # MambaCache, RwkvCache: fixed size
            live += c.nbytes()
            alloc += c.nbytes()
        else:  # KVCache: keys and values so far, inside buffers that double when full
            live += 2 * c.keys.numel() * c.keys.element_size()
            alloc += 2 * c._k.numel() * c._k.element_size()
    return live, alloc


@torch.no_grad()
def decode(model: nn.Module, lengths: list[int]) -> list[dict]:
    """Greedy decoding of max(lengths) tokens from one token; per length L: ms/token (median
    of the 16 steps before L) and the cache memory at L."""
    caches = model.new_caches()
    tok = torch.zeros(1, 1, dtype=torch.long)
    times: list[float] = []
    rows = []
    for step in range(1, max(lengths) + 1):
        start = time.perf_counter()
        logits = model(tok, caches=caches, last_only=True)  # (1, 1, V)
        tok = logits[:, -1].argmax(dim=-1, keepdim=True)  # (1, 1)
        times.append(time.perf_counter() - start)
        if step in lengths:
            live, alloc = cache_bytes(caches)
            rows.append(
                {
                    "L": step,
                    "ms_per_token": round(1e3 * statistics.median(times[-16:]), 3),
                    "cache_live_kib": round(live / 1024, 1),
                    "cache_alloc_kib": round(alloc / 1024, 1),
                }
            )
    rows.append({"total_s": round(sum(times), 2), "tokens": len(times)})
    return rows


# --------------------------------------------------------------------------- scaling


class MambaFFNBlock(nn.Module):
    """The GPT block with the Mamba mixer in place of attention: x + Mamba(LN x), then
    x + FFN(LN x) with d_ff = 4·d_model (GELU), as a Mamba layer of the hybrid LM has it."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.mixer = MambaBlock(d_model)
        self.ff = FeedForward(d_model, 4 * d_model, "gelu", dropout=0.0)

    def forward(self, x: torch.Tensor, is_causal: bool = True):
        x = x + self.mixer(self.norm1(x))  # (B, T, D)
        return x + self.ff(self.norm2(x)), None  # (B, T, D)


def _build_case(spec: dict, device: torch.device):
    """attnlab.bench.cases.build_case, plus the "mamba" kind of block."""
    from attnlab.bench import cases

    if spec["kind"] != "mamba":
        return cases._block_steps(spec, device)
    torch.manual_seed(0)
    model = MambaFFNBlock(spec["d_model"]).to(device)

    def make(T: int):
        x = torch.randn(spec["batch"], T, spec["d_model"], device=device, requires_grad=True)
        cot = torch.randn(spec["batch"], T, spec["d_model"], device=device)

        def step() -> None:
            out, _ = model(x)
            out.backward(cot)
            x.grad = None
            model.zero_grad(set_to_none=True)

        return step

    return make(min(spec["T"], 256)), make(spec["T"])


def child(spec: dict) -> None:
    """In a fresh process: measure one point with attnlab.bench.memory.measure."""
    from attnlab.bench import cases, memory

    cases.build_case = _build_case  # measure() looks it up at call time
    print(json.dumps(memory.measure(spec)))


def run_point(spec: dict, timeout_s: float) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"])}
    cmd = [sys.executable, "-m", "benchmarks.mixers.decode", "--child", json.dumps(spec)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def scaling(lengths: list[int], threads: int, time_cap_s: float, repeats: int) -> dict:
    settings = dict(
        batch=1,
        d_model=D_MODEL,
        n_heads=4,
        window=256,
        threads=threads,
        repeats=repeats,
        time_cap_s=time_cap_s,
        fit_from=1024,
        dtype="float32",
        mamba="d_state 16, expand 2, d_conv 4, chunked scan (chunk 16)",
    )
    points: dict[str, list[dict]] = {}
    for kind in ("mamba", *ATTENTION_KINDS):
        points[kind], last = [], None
        for T in lengths:
            row: dict = {"T": T}
            power = 2 if kind == "fused" else 1
            predicted = None if last is None else last[1] * (T / last[0]) ** power
            if predicted is not None and predicted > time_cap_s:
                row["skipped"] = f"predicted {predicted:.0f} s per step > cap {time_cap_s:.0f} s"
            else:
                spec = dict(settings, case="block", kind=kind, T=T, device="cpu")
                res = run_point(spec, timeout_s=60 + 4 * time_cap_s)
                if "error" in res:
                    row["skipped"] = res["error"]
                else:
                    row.update(ms=round(res["median_ms"], 2), peak_mib=round(res["peak_mib"], 1))
                    last = (T, res["median_ms"] / 1e3)
            print(f"  {kind:7s} T={T:6d} {row.get('ms', row.get('skipped'))}", flush=True)
            points[kind].append(row)
    exponents = {
        kind: {
            m: fit_exponent([(r["T"], r[m]) for r in rows if m in r], settings["fit_from"])
            for m in ("ms", "peak_mib")
        }
        for kind, rows in points.items()
    }
    return {"settings": settings, "points": points, "exponents": exponents}


# --------------------------------------------------------------------------- report


def render(result: dict, command: str) -> str:
    m = result["machine"]
    dec = result["decode"]
    lines = [
        "# Mamba and RWKV vs attention: decoding cost and training-step scaling",
        "",
        f"Generated by `{command}` (benchmarks/mixers/decode.py).",
        "",
        f"Machine: {m['cpu']}, {m['logical_cores']} logical cores shared with other jobs, torch "
        f"{m['torch']}, {m['torch_threads']} thread(s); load average "
        f"{m['load_average_at_start'][0]:.1f} at start, {m['load_average_at_end'][0]:.1f} at "
        "end. Times on a loaded machine are noisy; compare the two columns of one run.",
        "",
    ]
    if dec:
        p = dec["params"]
        names = [k for k in dec if k != "params"]
        label = {"gpt_kv_cache": "GPT", "mamba_state": "Mamba", "rwkv_state": "RWKV"}
        layers = {"gpt_kv_cache": "4 layers, KV cache", "mamba_state": "8 layers, state"}
        layers["rwkv_state"] = "4 layers, state"
        lines += [
            "## Decoding: ms per token and cache memory against generated length L",
            "",
            "Greedy, batch 1, float32, no_grad. "
            + "; ".join(f"{label[n]} {p[n]:,} parameters ({layers[n]})" for n in names)
            + ". ms/token: median of the 16 steps before L. Cache: live bytes at L (for the KV "
            "cache also the allocated buffers, which double when full).",
            "",
            "| L | "
            + " | ".join(f"{label[n]} ms/token" for n in names)
            + " | "
            + " | ".join(f"GPT / {label[n]}" for n in names[1:])
            + " | "
            + " | ".join(f"{label[n]} cache" for n in names)
            + " |",
            "|---:|" + "---:|" * (3 * len(names) - 1),
        ]
        for rows in zip(*(dec[n][:-1] for n in names)):
            g = rows[0]
            lines.append(
                f"| {g['L']} | "
                + " | ".join(f"{r['ms_per_token']:.2f}" for r in rows)
                + " | "
                + " | ".join(f"{g['ms_per_token'] / r['ms_per_token']:.2f}" for r in rows[1:])
                + " | "
                + " | ".join(
                    f"{r['cache_live_kib']:,.0f} KiB"
                    + (f" ({r['cache_alloc_kib']:,.0f})" if r is g else "")
                    for r in rows
                )
                + " |"
            )
        totals = ", ".join(f"{label[n]} {dec[n][-1]['total_s']} s" for n in names)
        lines += ["", f"Whole run ({dec[names[0]][-1]['tokens']} tokens): {totals}.", ""]
    if result.get("scaling"):
        lines += scaling_lines(result["scaling"])
        lines += [
            "mamba = the same block with the Mamba mixer in place of attention "
            f"({result['scaling']['settings']['mamba']}).",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-len", type=int, default=4096, help="longest decode (tokens)")
    parser.add_argument("--max-T", type=int, default=16384, help="longest scaling point")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--time-cap", type=float, default=60.0, help="seconds per step, max")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per point")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--out", default="docs/results/ssm_decode")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return
    torch.set_num_threads(args.threads)
    info = common.machine()
    lengths = [128 * 2**i for i in range(6) if 128 * 2**i <= args.max_len]
    nets = models(max(lengths))
    decode_result = {"params": {k: sum(p.numel() for p in m.parameters()) for k, m in nets.items()}}
    for name, model in nets.items():
        print(f"decoding {name} ...", flush=True)
        decode_result[name] = decode(model, lengths)
    result = {"machine": info, "decode": decode_result}
    if not args.skip_scaling:
        Ts = [512 * 2**i for i in range(6) if 512 * 2**i <= args.max_T]
        result["scaling"] = scaling(Ts, args.threads, args.time_cap, args.repeats)
    info["load_average_at_end"] = common.load_average()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    flags = f" --max-len {args.max_len} --max-T {args.max_T} --threads {args.threads}"
    flags += f" --time-cap {args.time_cap:g}" + (" --skip-scaling" if args.skip_scaling else "")
    command = f"python -m benchmarks.mixers.decode{flags}"
    text = render(result, command)
    common.write_page(out.with_suffix(".md"), text, command)
    print(text)


if __name__ == "__main__":
    main()
