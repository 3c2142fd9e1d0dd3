"""Training-step time of attnlab's Seq2SeqTransformer vs torch.nn.Transformer on the same batches.

Both models get the same embeddings, positions and tied projection (only the encoder-decoder
stacks differ), the same en->de Bible batches (shared BPE trained on the train split, token
budget), the same AdamW step and label-smoothed loss. Steps alternate between the two models
so that load on a shared machine hits both alike; the median step time is reported.

    python -m benchmarks.translate.speed --steps 30 --threads 1 --out docs/results/translate_speed
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.data.parallel import ParallelData
from attnlab.models.seq2seq import Seq2SeqTransformer
from attnlab.tasks.translate import build_config, encode_split, prepare
from benchmarks import common


class TorchSeq2Seq(nn.Module):
    """nn.Transformer between attnlab's embedding/position/projection pieces."""

    def __init__(self, ours: Seq2SeqTransformer) -> None:
        super().__init__()
        c = ours.cfg
        self.embed, self.pos, self.d = ours.tgt_embed, ours.pos, c.d_model
        self.transformer = nn.Transformer(
            c.d_model,
            c.n_heads,
            c.n_encoder_layers,
            c.n_decoder_layers,
            c.d_ff,
            dropout=c.dropout,
            batch_first=True,
        )

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        scale = math.sqrt(self.d)
        s, t = self.pos(self.embed(src) * scale), self.pos(self.embed(tgt) * scale)
        n = tgt.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool).triu(1)
        h = self.transformer(
            s,
            t,
            tgt_mask=causal,
            src_key_padding_mask=src == 0,
            tgt_key_padding_mask=tgt == 0,
            memory_key_padding_mask=src == 0,
        )
        return h @ self.embed.weight.T


def step_time(model: nn.Module, opt: torch.optim.Optimizer, batch: dict) -> float:
    start = time.perf_counter()
    logits = model(batch["src"], batch["tgt_in"])
    loss = F.cross_entropy(
        logits.flatten(0, 1), batch["tgt_out"].flatten(), ignore_index=0, label_smoothing=0.1
    )
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--config", default="default", help="bundled preset, or default")
    parser.add_argument("--out", type=Path, default=Path("docs/results/translate_speed"))
    args = parser.parse_args(argv)
    info = common.machine(threads=common.set_threads(args.threads))
    torch.manual_seed(0)
    cfg = build_config(None if args.config == "default" else args.config, {})
    prep = prepare(cfg, Path("/tmp/translate_speed_run"), resume=False)
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = prep.src_tok.vocab_size
    ids = encode_split(prep.splits["train"], prep, cfg.data.max_sentence_tokens)
    data = ParallelData(*ids, cfg.data.max_tokens, seed=0)
    batches = [data.collate(b) for b in data.batches(0)[: args.steps + 3]]
    ours = Seq2SeqTransformer(cfg.model)
    theirs = TorchSeq2Seq(Seq2SeqTransformer(cfg.model))
    models = {"attnlab": ours, "torch.nn.Transformer": theirs}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}
    for i, batch in enumerate(batches):
        for name, model in models.items():
            t = step_time(model, opts[name], batch)
            if i >= 3:  # warm-up steps are not counted
                times[name].append(t)
    tokens = statistics.median(int((b["tgt_out"] != 0).sum()) for b in batches)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "config": args.config,
        "model": {k: getattr(cfg.model, k) for k in ("d_model", "n_heads", "d_ff", "dropout")}
        | {"layers": f"{cfg.model.n_encoder_layers}+{cfg.model.n_decoder_layers}"},
        "max_tokens": cfg.data.max_tokens,
        "median_target_tokens_per_batch": tokens,
        "steps_timed": args.steps,
        "threads": args.threads,
        "median_step_s": {k: round(v, 4) for k, v in med.items()},
        "ratio_attnlab_over_torch": round(med["attnlab"] / med["torch.nn.Transformer"], 3),
        "machine": {**info, "load_average_at_end": common.load_average()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        "# Translation training step: attnlab vs torch.nn.Transformer",
        "",
        f"Config `{args.config}`, en->de Bible batches of at most "
        f"{cfg.data.max_tokens} padded tokens; median {tokens} target tokens). Forward, "
        "label-smoothed loss, backward and AdamW step; the models alternate step by step on a "
        "shared, busy 2-core CPU.",
        "",
        "| model | median step (s) |",
        "|---|---|",
        *[f"| {k} | {v:.4f} |" for k, v in med.items()],
        "",
        f"Ratio attnlab / nn.Transformer: **{result['ratio_attnlab_over_torch']:.3f}**.",
    ]
    common.write_page(args.out.with_suffix(".md"), md)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
