"""Speculative decoding on a trained Shakespeare target: acceptance, tokens/s, speed-up.

    python -m benchmarks.infer.speculative [--work runs/bench_speculative] [--tokens 200]

Trains (unless --work already holds them) a character-level target, 6 layers × 384 wide,
6 heads, context 128, batch 8, for at most --target-minutes of wall time, and a 1-layer draft
(128 wide, 4 heads, same data, same tokenizer) for at most --draft-minutes; both with
`attnlab train lm` on the default Shakespeare split, one thread. Then, one thread, float32,
greedy (temperature 0) unless stated: for each of three prompts cut from the validation text,
--tokens new tokens by plain cached decoding (Generation, one target pass per token), by
speculative decoding with the draft model for K in --ks, and by prompt lookup (no draft model).
Each mode runs --repeats times, interleaved with the plain decode, and the median time is used;
the output is checked to be the plain greedy output token for token. Also one row at
temperature 0.8 (its output is a sample, so not compared). Writes
docs/results/speculative.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from attnlab.data.text_lm import open_tokens
from attnlab.infer.generation import Generation, sample_next
from attnlab.infer.lm import LMRun
from attnlab.infer.speculative import ModelDrafter, NgramDrafter, speculative_decode
from attnlab.runs import training
from benchmarks import common

TARGET = {"n_layers": "6", "n_heads": "6", "d_model": "384", "context": "128",
          "batch_size": "8", "eval_every": "100", "checkpoint_every": "100",
          "eval_windows": "50", "sample_tokens": "0", "num_threads": "1"}  # fmt: skip
DRAFT = {**TARGET, "n_layers": "1", "n_heads": "4", "d_model": "128", "batch_size": "12"}


def train(out: Path, settings: dict, minutes: float, steps: int) -> dict:
    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text())
    training.train("lm", out, {**settings, "max_minutes": str(minutes), "max_steps": str(steps)})
    return json.loads((out / "summary.json").read_text())


@torch.no_grad()
def plain(model, prompt: torch.Tensor, n: int, temperature: float, seed: int) -> list[int]:
    gen = Generation(model, prompt)
    rng = torch.Generator().manual_seed(seed)
    for _ in range(n):
        gen.append(sample_next(gen.next_logits(), temperature, generator=rng))
    return gen.ids[0, prompt.shape[1] :].tolist()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="runs/bench_speculative")
    parser.add_argument("--target-minutes", type=float, default=12.0)
    parser.add_argument("--draft-minutes", type=float, default=3.0)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--ks", default="1,2,4,6,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="docs/results/speculative")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    work = Path(args.work)
    target_summary = train(work / "target", TARGET, args.target_minutes, 100000)
    draft_summary = train(work / "draft", DRAFT, args.draft_minutes, 100000)
    target, draft = LMRun.load(work / "target"), LMRun.load(work / "draft")
    tokens = open_tokens(work / "target" / "data" / "val.bin", target.tokenizer.vocab_size)
    starts = (1000, 50000, 200000)
    prompts = [torch.from_numpy(tokens[s : s + 64].astype(np.int64))[None] for s in starts]
    load_start = common.load_average()
    ks = [int(k) for k in args.ks.split(",")]
    modes = [("draft", k) for k in ks] + [("prompt lookup", k) for k in ks]
    rows = []
    for temperature in (0.0, 0.8):
        for name, k in modes if temperature == 0 else [("draft", 4), ("prompt lookup", 4)]:
            base_s, spec_s, stats_all, same = [], [], [], True
            for i, prompt in enumerate(prompts):
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    want = plain(target.model, prompt, args.tokens, temperature, i)
                    t1 = time.perf_counter()
                    drafter = ModelDrafter(draft.model) if name == "draft" else NgramDrafter(3)
                    rng = torch.Generator().manual_seed(i)
                    got, stats = speculative_decode(
                        target.model, prompt, args.tokens, drafter, k,
                        temperature=temperature, generator=rng,
                    )  # fmt: skip
                    base_s.append(t1 - t0)
                    spec_s.append(time.perf_counter() - t1)
                    if temperature == 0:
                        same = same and got == want
                stats_all.append(stats)
            n_tok = args.tokens
            base, spec = statistics.median(base_s), statistics.median(spec_s)
            proposed = sum(s.proposed for s in stats_all)
            row = {
                "mode": name, "K": k, "temperature": temperature,
                "acceptance_rate": sum(s.accepted for s in stats_all) / max(1, proposed),
                "tokens_per_pass": sum(s.emitted for s in stats_all)
                / sum(s.rounds for s in stats_all),
                "plain_tok_s": n_tok / base, "spec_tok_s": n_tok / spec,
                "speedup": statistics.median(b / s for b, s in zip(base_s, spec_s)),
                "identical_to_plain_greedy": same if temperature == 0 else None,
            }  # fmt: skip
            print(row, flush=True)
            rows.append(row)
    info = common.machine()
    info["load_average_at_start"] = load_start
    info["load_average_at_end"] = common.load_average()
    command = f"python -m benchmarks.infer.speculative --tokens {args.tokens} --ks {args.ks}"
    runs = {
        name: {"settings": settings, "max_minutes": minutes, "steps": summary.get("steps"),
               "val_loss": summary.get("best_metric"), "cpu_s": summary.get("cpu_time_s"),
               "params": run.model.num_params()}
        for name, settings, minutes, summary, run in (
            ("target", TARGET, args.target_minutes, target_summary, target),
            ("draft", DRAFT, args.draft_minutes, draft_summary, draft),
        )
    }  # fmt: skip
    result = {"command": command, "runs": runs, "rows": rows, "machine": info}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    t, d = runs["target"], runs["draft"]
    lines = [
        "# Speculative decoding: a trained Shakespeare target, a 1-layer draft, prompt lookup",
        "",
        f"`{command}`",
        "",
        f"Target: 6 layers × 384, {t['params'] / 1e6:.2f}M parameters, {t['steps']} steps "
        f"(≤ {t['max_minutes']:g} min), val loss {t['val_loss']:.3f}. Draft: 1 layer × 128, "
        f"{d['params'] / 1e6:.2f}M parameters, {d['steps']} steps (≤ {d['max_minutes']:g} min), "
        f"val loss {d['val_loss']:.3f}. Character level, context 128. Three 64-token prompts "
        f"from the validation text, {args.tokens} new tokens each, {args.repeats} interleaved "
        "repeats; one thread, float32. Speed-up = median over runs of plain time / speculative "
        f"time. Load average {load_start[0]:.1f} at start, {info['load_average_at_end'][0]:.1f} "
        f"at end ({info['cpu']}, {info['logical_cores']} cores shared with other jobs).",
        "",
        "| mode | K | temperature | acceptance | tokens / target pass | plain tok/s | "
        "speculative tok/s | speed-up | = plain greedy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        same = {True: "yes", False: "NO", None: "(sampled)"}[r["identical_to_plain_greedy"]]
        lines.append(
            f"| {r['mode']} | {r['K']} | {r['temperature']:g} | {r['acceptance_rate']:.2f} | "
            f"{r['tokens_per_pass']:.2f} | {r['plain_tok_s']:.1f} | {r['spec_tok_s']:.1f} | "
            f"{r['speedup']:.2f}× | {same} |"
        )
    common.write_page(out.with_suffix(".md"), lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
