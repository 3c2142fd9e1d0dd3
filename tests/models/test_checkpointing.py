"""Gradient checkpointing: one config flag on every model, same gradients, blocks recomputed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from attnlab.layers.blocks import Block, DecoderBlock
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.classifier import ClassifierConfig, TextClassifier
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.models.vit import ViT, ViTConfig


def gpt(flag: bool) -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    cfg = GPTConfig(vocab_size=20, context=16, n_layers=2, n_heads=2, d_model=16)
    cfg.gradient_checkpointing = flag
    ids = torch.randint(0, 20, (2, 16))
    return GPT(cfg), lambda m: m(ids).square().mean()


def classifier(flag: bool):
    cfg = ClassifierConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, dropout=0.0)
    cfg.attn_dropout = cfg.emb_dropout = 0.0
    cfg.gradient_checkpointing = flag
    ids, lengths = torch.randint(3, 20, (2, 9)), torch.tensor([9, 5])
    return TextClassifier(cfg), lambda m: m(ids, lengths).square().mean()


def seq2seq(flag: bool):
    cfg = Seq2SeqConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2, d_ff=32)
    cfg.n_encoder_layers = cfg.n_decoder_layers = 2
    cfg.dropout, cfg.gradient_checkpointing = 0.0, flag
    src, tgt = torch.randint(1, 20, (2, 7)), torch.randint(1, 20, (2, 5))
    return Seq2SeqTransformer(cfg), lambda m: m(src, tgt).square().mean()


def vit(flag: bool):
    cfg = ViTConfig(image_size=8, patch_size=4, d_model=16, n_layers=2, n_heads=2, d_ff=32)
    cfg.dropout, cfg.gradient_checkpointing = 0.0, flag
    images = torch.randn(2, 1, 8, 8)
    return ViT(cfg), lambda m: m(images).square().mean()


def bert(flag: bool):
    cfg = BertConfig(vocab_size=20, d_model=16, n_layers=2, n_heads=2, d_ff=32, context=16)
    cfg.dropout = cfg.attn_dropout = 0.0
    cfg.gradient_checkpointing = flag
    ids = torch.randint(1, 20, (2, 9))
    return BertModel(cfg), lambda m: m(ids, torch.tensor([9, 4])).square().mean()


def counted(forward: Callable, calls: dict[str, int], name: str) -> Callable:
    def wrapper(*args, **kwargs):
        calls[name] += 1
        return forward(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize("build", [gpt, classifier, seq2seq, vit, bert])
def test_checkpointing_flag_gives_the_same_gradients_and_recomputes_blocks(build, seed):
    torch.manual_seed(seed)
    plain, loss_fn = build(False)
    torch.manual_seed(seed)
    ckpt, _ = build(True)
    ckpt.load_state_dict(plain.state_dict())
    calls = {"plain": 0, "ckpt": 0}
    for name, model in (("plain", plain), ("ckpt", ckpt)):
        model.train()
        for block in model.modules():
            if isinstance(block, Block | DecoderBlock):
                # Wrap forward itself: module hooks do not fire in checkpoint's recomputation.
                block.forward = counted(block.forward, calls, name)
        loss_fn(model).backward()
    assert calls["ckpt"] == 2 * calls["plain"] > 0  # each block ran again in backward
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        if p.grad is None:
            assert q.grad is None, name
            continue
        torch.testing.assert_close(q.grad, p.grad, msg=name)
