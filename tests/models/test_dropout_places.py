"""Where a BERT-family layer drops activations in training, beside transformers' own layer: on
each sub-layer's output (and the attention weights), never between the feed-forward layer's
two matmuls. Eval-mode parity (test_bert, test_zoo_parity) cannot see a dropout too many."""

from __future__ import annotations

import pytest
from torch import nn

pytest.importorskip("transformers")

P = 0.1


def active(module: nn.Module) -> int:
    """How many dropout layers in ``module`` drop anything."""
    return sum(isinstance(m, nn.Dropout) and m.p > 0 for m in module.modules())


def attnlab_bert_block(kind: str) -> nn.Module:
    from attnlab.layers.blocks import Block
    from attnlab.models.albert import AlbertConfig
    from attnlab.models.bert import BertConfig
    from attnlab.models.deberta import DebertaConfig, DebertaLayer

    shape = dict(vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=1, dropout=P)
    if kind == "bert":
        return Block(BertConfig(**shape, attn_dropout=0.0).block_config())
    if kind == "albert":
        return Block(AlbertConfig(**shape, attn_dropout=0.0).block_config())
    return DebertaLayer(DebertaConfig(**shape))


def hf_layer(kind: str) -> nn.Module:
    import transformers as tf

    shape = dict(vocab_size=50, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                 num_hidden_layers=1, hidden_dropout_prob=P,
                 attention_probs_dropout_prob=0.0)  # fmt: skip
    if kind == "bert":
        return tf.models.bert.modeling_bert.BertLayer(tf.BertConfig(**shape))
    if kind == "albert":
        albert = tf.AlbertConfig(**shape, embedding_size=16)
        return tf.models.albert.modeling_albert.AlbertLayer(albert)
    return tf.models.deberta_v2.modeling_deberta_v2.DebertaV2Layer(tf.DebertaV2Config(**shape))


@pytest.mark.parametrize("kind", ["bert", "albert", "deberta"])
def test_a_layer_drops_where_transformers_drops(kind):
    ours, theirs = attnlab_bert_block(kind), hf_layer(kind)
    assert active(ours) == active(theirs), (kind, active(ours), active(theirs))
