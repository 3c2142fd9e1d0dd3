"""A tiny random encoder of multilingual-e5's layout, for the classify tests: e5's real
250k-piece SentencePiece tokenizer, a 4-bit packed word table, XLM-R's position offset, width
32, so a run takes seconds. The ``tiny`` fixture (conftest.py) puts it where e5's registry
entry loads the real one."""

from __future__ import annotations

import torch

from attnlab.models.bert import BertConfig, BertModel


def tiny_e5(path=None, dropout: float = 0.1, prefix: str = "query: "):
    """e5's tokenizer around a random 2-layer encoder of its layout (packed words, offset)."""
    from attnlab.data.sentencepiece import SentencePieceTokenizer
    from attnlab.models.e5 import tokenizer_path

    cfg = BertConfig(vocab_size=250037, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                     context=512, pad_id=1, position_offset=2, packed_words=True,
                     dropout=dropout, attn_dropout=dropout)  # fmt: skip
    with torch.random.fork_rng():  # the same random encoder at every call
        torch.manual_seed(0)
        model = BertModel(cfg)
    return model, SentencePieceTokenizer.load(tokenizer_path(), prefix=prefix)
