"""torch.nn.Transformer's encoder and decoder stacks behind attnlab's Seq2SeqTransformer.

Same embeddings, positions, tied projection and call signature as attnlab's model; only the
stacks differ. nn.TransformerDecoder has no KV cache, so this model decodes without one (the same
search, slower). Trained by ``benchmarks/translate/train.py --stacks torch`` (same data,
tokenizer, loss, schedule, seed and budget as attnlab's stacks):

    python -m benchmarks.translate.train --stacks torch --out docs/results/translate_ende_torch
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer


class TorchEncoder(nn.Module):
    """nn.TransformerEncoder behind attnlab's BlockStack call (x, mask True = real token)."""

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
