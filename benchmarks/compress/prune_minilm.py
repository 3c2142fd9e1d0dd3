"""Head pruning of MiniLM (all-MiniLM-L6-v2, the shipped weights): accuracy, size, speed.

MiniLM is not fine-tuned (that costs more CPU than this machine lends): a logistic-regression
head is fitted on its frozen mean-pooled sentence vectors of a balanced sample of Pang & Lee
sentence polarity, and the encoder + head is the classifier whose heads are pruned. Importance
(Michel et al. 2019) on a validation sample, then 0, k, 2k, ... of the 72 heads removed (one
per layer always stays), nothing retrained; test accuracy of each, parameters, and the forward
time of the same test batch, one thread, side by side in this one process.

    python -m benchmarks.compress.prune_minilm [--n 600] [--every 6]
        -> docs/results/prune_heads_minilm.{json,md}
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
from sklearn.linear_model import LogisticRegression

from attnlab.commands.prune import accuracy, count_parameters, loss_fn
from attnlab.compress.heads import head_importance, heads_to_remove, prune_heads
from attnlab.data.buckets import pad_batch
from attnlab.data.english_sentiment import balanced_subsample, load_pang_lee
from attnlab.models.bert import BertClassifier
from attnlab.models.bert_folder import read_folder
from benchmarks import common
from benchmarks.compress.prune_heads import latency_ms, timing_batch

MAX_LEN = 48


def batches(texts, labels, tokenizer, size: int = 64) -> list[dict[str, torch.Tensor]]:
    out = []
    for start in range(0, len(texts), size):
        ids, lengths = pad_batch(tokenizer.encode_batch(texts[start : start + size], MAX_LEN))
        out.append(
            {"input_ids": ids, "lengths": lengths,
             "labels": torch.tensor(labels[start : start + size])}
        )  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=600, help="sentences (train/val/test 50/25/25)")
    parser.add_argument("--every", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    info = common.machine(threads=1)
    load_start = info["load_average_at_start"][0]
    corpus = balanced_subsample(load_pang_lee(), args.n, 0)
    names = sorted(set(corpus.labels))
    y = [names.index(label) for label in corpus.labels]
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0)).tolist()
    parts = {"train": order[: args.n // 2], "val": order[args.n // 2 : 3 * args.n // 4],
             "test": order[3 * args.n // 4 :]}  # fmt: skip
    encoder, _, tokenizer, _ = read_folder("minilm")
    model = BertClassifier(encoder.cfg, len(names), "mean").eval()
    model.bert.load_state_dict(encoder.state_dict())
    data = {
        k: batches([corpus.texts[i] for i in idx], [y[i] for i in idx], tokenizer)
        for k, idx in parts.items()
    }
    with torch.no_grad():  # the linear probe: mean-pooled frozen features -> logistic regression
        from attnlab.models.bert import mean_pool

        feats = [mean_pool(model.bert(b["input_ids"], b["lengths"]), b["lengths"])
                 for b in data["train"]]  # fmt: skip
    probe = LogisticRegression(max_iter=2000, C=1.0).fit(
        torch.cat(feats).numpy(), torch.cat([b["labels"] for b in data["train"]]).numpy()
    )
    with torch.no_grad():
        if len(names) == 2:  # sklearn's one column of logits for two classes
            w = torch.tensor(probe.coef_[0], dtype=torch.float32)
            model.head.weight.copy_(torch.stack([-w / 2, w / 2]))
            b = float(probe.intercept_[0])
            model.head.bias.copy_(torch.tensor([-b / 2, b / 2]))
        else:
            model.head.weight.copy_(torch.tensor(probe.coef_, dtype=torch.float32))
            model.head.bias.copy_(torch.tensor(probe.intercept_, dtype=torch.float32))
    importance = head_importance(model, data["val"], loss_fn)
    total, layers = int(torch.isfinite(importance).sum()), importance.shape[0]
    timing = timing_batch(data["test"], 128)
    rows = []
    for n in sorted({*range(0, total - layers + 1, args.every), total - layers}):
        pruned = copy.deepcopy(model)
        kept = prune_heads(pruned, heads_to_remove(importance, n))
        rows.append(
            {
                "heads_removed": n,
                "heads_per_layer": kept,
                "val": accuracy(pruned, data["val"]),
                "test": accuracy(pruned, data["test"]),
                "parameters": count_parameters(pruned),
                "latency_ms": latency_ms(pruned, timing, args.rounds),
            }
        )
        print(n, kept, rows[-1]["test"], f"{rows[-1]['latency_ms']:.1f} ms", flush=True)
    for row in rows:
        row["speed_vs_unpruned"] = rows[0]["latency_ms"] / row["latency_ms"]
    meta = {
        **info,
        "load_average_at_end": common.load_average(),
        "sentences": args.n,
        "max_len": MAX_LEN,
        "timing_batch": list(timing["input_ids"].shape),
    }
    command = f"python -m benchmarks.compress.prune_minilm --n {args.n} --every {args.every}"
    stem = Path("docs/results/prune_heads_minilm")
    stem.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "command": command, "importance": [
            [float(v) for v in r] for r in importance], "rows": rows}, indent=2) + "\n"
    )  # fmt: skip
    lines = [
        "# MiniLM heads removed: accuracy, size, speed (`benchmarks/compress/prune_minilm.py`)",
        "",
        f"`{command}`",
        "",
        f"all-MiniLM-L6-v2 (6 layers × 12 heads) + a logistic-regression head on its frozen "
        f"mean-pooled vectors, fitted on {len(parts['train'])} Pang & Lee sentences; importance "
        f"on {len(parts['val'])}, accuracy on {len(parts['test'])} others; {MAX_LEN} tokens; "
        f"nothing retrained after pruning. Latency: median of {args.rounds} forward passes over "
        f"the same test batch {meta['timing_batch']}, one thread, {meta['logical_cores']} logical "
        f"cores shared with other jobs (load {load_start:.1f} at start, "
        f"{meta['load_average_at_end'][0]:.1f} at end).",
        "",
        "| heads removed | kept per layer | val acc | test acc | attention params | all params "
        "| latency ms | speed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['heads_removed']} | {row['heads_per_layer']} | {row['val']['accuracy']:.3f} "
            f"| {row['test']['accuracy']:.3f} | {row['parameters']['attention']:,} | "
            f"{row['parameters']['total']:,} | {row['latency_ms']:.1f} | "
            f"{row['speed_vs_unpruned']:.2f}x |"
        )
    common.write_page(stem.with_suffix(".md"), lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
