"""The en->de benchmark again with torch.nn.Transformer's encoder/decoder in place of attnlab's.

Same data, tokenizer, embeddings, tied projection, loss, schedule, seed and step budget as
``translate_train.py``; only the stacks differ. nn.TransformerDecoder has no KV cache, so this
model decodes without one (the same search, slower).

    python benchmarks/translate_torch_baseline.py --steps 600 --minutes 14
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.tasks import translate


class TorchEncoder(nn.Module):
    """nn.TransformerEncoder behind attnlab's Encoder call (x, mask True = real token)."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, batch_first=True
        )
        self.stack = nn.TransformerEncoder(
            layer, cfg.n_encoder_layers, nn.LayerNorm(cfg.d_model), enable_nested_tensor=False
        )

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        return self.stack(x, src_key_padding_mask=~mask[:, 0, 0, :])


class TorchDecoder(nn.Module):
    """nn.TransformerDecoder behind attnlab's Decoder call (no caches)."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        layer = nn.TransformerDecoderLayer(
            cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, batch_first=True
        )
        self.stack = nn.TransformerDecoder(layer, cfg.n_decoder_layers, nn.LayerNorm(cfg.d_model))

    def forward(self, x: Tensor, memory: Tensor, self_mask, memory_mask: Tensor, **_) -> Tensor:
        n = x.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
        pad = None if self_mask is None else ~self_mask[:, 0, 0, :]
        return self.stack(
            x,
            memory,
            tgt_mask=causal,
            tgt_key_padding_mask=pad,
            memory_key_padding_mask=~memory_mask[:, 0, 0, :],
        )


class TorchSeq2Seq(Seq2SeqTransformer):
    """attnlab's embeddings/positions/projection around nn.Transformer's stacks."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__(cfg)
        self.encoder = TorchEncoder(cfg)  # type: ignore[assignment]
        self.decoder = TorchDecoder(cfg)  # type: ignore[assignment]

    def new_caches(self):  # type: ignore[override]
        return None  # decoding feeds the whole prefix every step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="small")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--minutes", type=float, default=14.0)
    parser.add_argument("--run", type=Path, default=Path("runs/bench-translate-torch"))
    parser.add_argument("--out", type=Path, default=Path("docs/results/translate_ende_torch"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    translate.Seq2SeqTransformer = TorchSeq2Seq  # type: ignore[misc]  # train and load it
    shutil.rmtree(args.run, ignore_errors=True)
    start = time.perf_counter()
    overrides = {"max_steps": str(args.steps), "max_minutes": str(args.minutes)}
    results = translate.train(args.run, overrides, args.config)
    summary, beam = results["summary"], results["test"]
    report = {
        "model": "torch.nn.Transformer stacks, attnlab embeddings/projection",
        "n_params": results["n_params"],
        "train_wall_s": round(summary["wall_time_s"], 1),
        "steps": summary["steps"],
        "best_val_loss": round(summary["best_metric"], 4),
        "total_wall_s_with_eval": round(time.perf_counter() - start, 1),
        "test_beam": beam,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    print(json.dumps(report, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
