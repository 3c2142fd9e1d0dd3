"""Training-step time, model FLOPs utilisation and decoding speed of attnlab's GPT vs references.

Training step (forward, cross-entropy, backward, AdamW step, zero_grad; float32, no autocast), in
one process, interleaved round by round so that background load hits every model alike:
  attnlab GPT (GPT-2 layout, GELU tanh) | Hugging Face GPT2LMHeadModel (gelu_new, sdpa) |
  a nanoGPT-style model (karpathy/nanoGPT model.py's structure: exact GELU, fused causal
  sdpa, tied embeddings; its dropout layers, all p = 0 here, left out)
with the same sizes, batch, vocabulary (84, the Shakespeare characters) and AdamW groups.
MFU = (6N + 12·L·d·T) FLOPs per token (PaLM appendix B, N without the position table) × tokens
per step / step time / peak, where the peak is the best float32 matmul rate measured in the same
rounds (square matmuls of 1024 and 2048).

Decoding: 500 new tokens after a 10-token prompt, greedy, batch 1, 4 layers × width 128
(context 1024 so that no window slides): attnlab with and without its KV cache against
`GPT2LMHeadModel.generate(use_cache=True/False)`.

    python -m benchmarks.lm.speed [--threads 2] [--rounds 10] [--out docs/results/lm_speed]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from torch import nn

from attnlab.bench import suites
from attnlab.infer.generation import Generation, sample_next
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.train.optim import build_optimizer
from benchmarks import common

VOCAB = 84
CONFIGS = {  # name: (layers, heads, width, context, batch)
    "baby": (4, 4, 128, 64, 12),
    "small": (6, 6, 384, 256, 12),
}


# ---------------------------------------------------------------------------- nanoGPT reference


class NanoBlock(nn.Module):
    """nanoGPT's Block: x + attn(ln_1(x)), then x + mlp(ln_2(x)); exact GELU."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj, self.gelu = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, Dh)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    """nanoGPT's GPT (bias=True), weight-tied; returns logits (B, T, V)."""

    def __init__(self, layers: int, heads: int, d: int, context: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, d), nn.Embedding(context, d)
        self.h = nn.ModuleList(NanoBlock(d, heads) for _ in range(layers))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ---------------------------------------------------------------------------- models


def attnlab_gpt(layers: int, heads: int, d: int, context: int, activation: str) -> GPT:
    return GPT(
        GPTConfig(
            vocab_size=VOCAB,
            context=context,
            n_layers=layers,
            n_heads=heads,
            d_model=d,
            activation=activation,
            bias=True,
        )
    )


def hf_gpt2(layers: int, heads: int, d: int, context: int) -> nn.Module:
    """The same Hugging Face model `attnlab bench` times."""
    return suites.hf_gpt2(transformers, layers, heads, d, context)


class HFLogits(nn.Module):
    """GPT2LMHeadModel returning plain logits, like the others."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).logits


def make_step(model: nn.Module, ids: torch.Tensor, targets: torch.Tensor):
    """One training step of ``model`` on a fixed batch, with attnlab's AdamW groups."""
    opt = build_optimizer(model, 1e-4, 0.1, (0.9, 0.99))

    def step() -> None:
        logits = model(ids)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def matmul_rate() -> float:
    """Best float32 GFLOP/s of one 1024² and one 2048² matmul (timed once each)."""
    best = 0.0
    for n in (1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        start = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - start) / 1e9)
    return best


# ---------------------------------------------------------------------------- benchmarks


def bench_training(name: str, rounds: int) -> dict:
    """Interleaved step times of every model, the matmul peak, ratios and MFU."""
    layers, heads, d, context, batch = CONFIGS[name]
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (batch, context))
    targets = torch.randint(0, VOCAB, (batch, context))
    ours = attnlab_gpt(layers, heads, d, context, "gelu_tanh")
    models = {
        "attnlab": ours,
        "attnlab_exact_gelu": attnlab_gpt(layers, heads, d, context, "gelu"),
        "hf_gpt2": HFLogits(hf_gpt2(layers, heads, d, context)),
        "nanogpt_style": NanoGPT(layers, heads, d, context),
    }
    steps = {k: make_step(m, ids, targets) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in steps}
    peak = 0.0
    for r in range(rounds + 2):  # two warm-up rounds
        peak = max(peak, matmul_rate())
        for key, step in steps.items():
            start = time.perf_counter()
            step()
            if r >= 2:
                times[key].append(time.perf_counter() - start)
    flops = ours.flops_per_token() * batch * context
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = {
        k: statistics.median(a / b for a, b in zip(times[k], times["hf_gpt2"])) for k in times
    }
    return {
        "config": dict(layers=layers, heads=heads, width=d, context=context, batch=batch),
        "params_non_embedding": ours.num_params(),
        "flops_per_step": flops,
        "peak_gflops": peak,
        "median_step_ms": {k: 1000 * v for k, v in med.items()},
        "min_step_ms": {k: 1000 * min(v) for k, v in times.items()},
        "ratio_to_hf_median_of_rounds": ratios,
        "mfu_median": {k: flops / med[k] / (peak * 1e9) for k in med},
        "mfu_best": {k: flops / min(v) / (peak * 1e9) for k, v in times.items()},
        "rounds": rounds,
    }


def bench_decoding(rounds: int, new_tokens: int = 500) -> dict:
    """ms per generated token: attnlab with/without cache vs HF generate with/without cache."""
    torch.manual_seed(0)
    ours = attnlab_gpt(4, 4, 128, 1024, "gelu_tanh").eval()
    hf = hf_gpt2(4, 4, 128, 1024).eval()
    prompt = torch.randint(0, VOCAB, (1, 10))

    def attnlab_run(use_cache: bool):
        def run() -> torch.Tensor:
            gen = Generation(ours, prompt, use_cache)
            for _ in range(new_tokens):
                gen.append(sample_next(gen.next_logits(), temperature=0))
            return gen.ids

        return run

    def hf_run(use_cache: bool):
        def run() -> torch.Tensor:
            with torch.no_grad():
                return hf.generate(
                    prompt,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    use_cache=use_cache,
                )

        return run

    runs = {
        "attnlab_cache": attnlab_run(True),
        "hf_generate_cache": hf_run(True),
        "attnlab_no_cache": attnlab_run(False),
        "hf_generate_no_cache": hf_run(False),
    }
    ms: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for key, run in runs.items():
            start = time.perf_counter()
            out = run()
            ms[key].append(1000 * (time.perf_counter() - start) / new_tokens)
            assert out.shape[1] == prompt.shape[1] + new_tokens
    return {
        "config": dict(layers=4, heads=4, width=128, context=1024, vocab=VOCAB, batch=1),
        "new_tokens": new_tokens,
        "median_ms_per_token": {k: statistics.median(v) for k, v in ms.items()},
        "all_ms_per_token": ms,
    }


def write_markdown(results: dict, path: Path) -> None:
    info = common.upgrade_machine(results["machine"])
    lines = [
        "# GPT speed: training step, MFU and decoding (`benchmarks/lm/speed.py`)",
        "",
        common.machine_line(info) + " Other jobs share the machine.",
        "",
        f"transformers {info['transformers']}. float32, no autocast. Each round times every "
        "model once, in turn; medians over rounds.",
        "",
    ]
    for name, r in results["training"].items():
        c = r["config"]
        lines += [
            f"## Training step, {name}: {c['layers']} layers × {c['heads']} heads × width "
            f"{c['width']}, context {c['context']}, batch {c['batch']}",
            "",
            f"{r['params_non_embedding'] / 1e6:.2f}M parameters; "
            f"{r['flops_per_step'] / 1e9:.1f} GFLOP per step; measured float32 matmul peak "
            f"{r['peak_gflops']:.0f} GFLOP/s; {r['rounds']} rounds.",
            "",
            "| model | median step (ms) | best step (ms) | × HF (median of rounds) | MFU median | "
            "MFU best |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for key in r["median_step_ms"]:
            lines.append(
                f"| {key} | {r['median_step_ms'][key]:.1f} | {r['min_step_ms'][key]:.1f} | "
                f"{r['ratio_to_hf_median_of_rounds'][key]:.3f} | {r['mfu_median'][key]:.1%} | "
                f"{r['mfu_best'][key]:.1%} |"
            )
        lines.append("")
    d = results["decoding"]
    lines += [
        f"## Decoding {d['new_tokens']} tokens, 4 layers × width 128, batch 1, greedy",
        "",
        "| run | median ms/token |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v:.2f} |" for k, v in d["median_ms_per_token"].items()]
    common.write_page(path, lines, common.recorded_command(results, path))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = default")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--decode-rounds", type=int, default=3)
    parser.add_argument("--configs", default="baby,small")
    parser.add_argument("--out", default="docs/results/lm_speed")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    machine = common.machine(transformers=transformers.__version__)
    results: dict = {"command": common.command_line(), "machine": machine, "training": {}}
    for name in args.configs.split(","):
        rounds = args.rounds * (3 if name == "baby" else 1)
        results["training"][name] = bench_training(name, rounds)
        print(json.dumps(results["training"][name]["ratio_to_hf_median_of_rounds"]), flush=True)
    results["decoding"] = bench_decoding(args.decode_rounds)
    results["machine"]["load_average_at_end"] = common.load_average()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    write_markdown(results, out.with_suffix(".md"))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
