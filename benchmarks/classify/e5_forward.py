"""The e5 encoder's forward pass in tokens a second, by batch size, beside `transformers`'
XLMRobertaModel of the same shape: what the main job's frozen pass, features and evaluation
cost on this machine, and the batch size the preset takes for them.

The first ``--texts`` bundled reviews, encoded as the classifier encodes them (the "query: "
prefix, at most 128 pieces), sorted by length and cut into batches; no gradient. Each case
runs ``--rounds`` times, cases interleaved, and the median counts. The Hugging Face model has
random weights of e5's shape (the speed of a forward does not depend on the values).

    python -m benchmarks.classify.e5_forward [--texts 512] [--rounds 3] [--threads 2]
        -> docs/results/e5_forward.{json,md}
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from benchmarks.common import (
    command_line,
    load_average,
    machine,
    machine_line,
    set_threads,
    write_results,
)

STEM = "e5_forward"
BATCHES = (128, 32, 8)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--texts", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    threads = set_threads(args.threads)
    load_start = load_average()
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    from attnlab.data import load_chinese_reviews, pad_batch
    from attnlab.models.e5 import load_e5

    ours, tokenizer = load_e5(dropout=0.0)
    ours.eval()
    c = ours.cfg
    theirs = XLMRobertaModel(
        XLMRobertaConfig(
            vocab_size=c.vocab_size, hidden_size=c.d_model, num_hidden_layers=c.n_layers,
            num_attention_heads=c.n_heads, intermediate_size=c.d_ff,
            max_position_embeddings=c.context + c.position_offset, layer_norm_eps=c.norm_eps,
            pad_token_id=c.pad_id,
        ),
        add_pooling_layer=False,
    ).eval()  # fmt: skip
    seqs = sorted(tokenizer.encode_batch(load_chinese_reviews().texts[: args.texts], 128), key=len)
    n_tokens = sum(len(s) for s in seqs)

    def rate(model: str, batch: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            for i in range(0, len(seqs), batch):
                ids, lengths = pad_batch(seqs[i : i + batch], c.pad_id)
                if model == "attnlab":
                    ours(ids, lengths)
                else:
                    mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()
                    theirs(input_ids=ids, attention_mask=mask)
        return n_tokens / (time.perf_counter() - start)

    cases = [("attnlab", b) for b in BATCHES] + [("transformers", b) for b in BATCHES]
    seen: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    for r in range(args.rounds):
        for case in cases:
            seen[case].append(rate(*case))
            print(f"round {r + 1}: {case[0]} batch {case[1]}: {seen[case][-1]:.0f} tokens/s")
    info = machine(threads, load_average_at_end=load_average())
    info["load_average_at_start"] = load_start
    medians = {f"{m} {b}": statistics.median(v) for (m, b), v in seen.items()}
    lines = [
        "# The e5 encoder's forward pass, tokens a second by batch size",
        "",
        machine_line(info),
        "",
        f'The first {args.texts} bundled reviews ({n_tokens:,} pieces with the "query: " '
        f"prefix, at most 128 a text), sorted by length; no gradient; median of {args.rounds} "
        "interleaved rounds.",
        "",
        "| batch | attnlab (tokens/s) | transformers XLMRobertaModel (tokens/s) | ratio |",
        "|---|---|---|---|",
    ]
    for b in BATCHES:
        a, t = medians[f"attnlab {b}"], medians[f"transformers {b}"]
        lines.append(f"| {b} | {a:,.0f} | {t:,.0f} | {a / t:.2f} |")
    write_results(
        STEM,
        {"machine": info, "texts": args.texts, "tokens": n_tokens, "tokens_per_s": medians},
        lines,
        command_line(),
    )


if __name__ == "__main__":
    main()
