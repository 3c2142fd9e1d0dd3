"""Parameter groups: what gets weight decay (AdamW), and which tensors Muon updates."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.train.optim import (
    build_muon_optimizer,
    build_optimizer,
    fused_ok,
    muon_params,
    output_head,
    param_groups,
)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.pos = nn.Parameter(torch.zeros(1, 3, 4))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied output layer
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)

    def no_weight_decay(self) -> set[str]:
        return {"pos"}


def test_decay_only_matrices_that_are_not_embeddings() -> None:
    model = Tied()
    decay, no_decay = param_groups(model, weight_decay=0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {id(model.proj.weight)}
    expected = {model.embed.weight, model.proj.bias, model.norm.weight, model.norm.bias, model.pos}
    assert {id(p) for p in no_decay["params"]} == {id(p) for p in expected}
    assert len(no_decay["params"]) == len(expected)  # the tied weight appears once


def test_decay_is_decoupled_and_skips_no_decay_group() -> None:
    """With zero gradients AdamW only applies decay: p <- p * (1 - lr * wd) on decayed params."""
    model = Tied()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, lr=0.1, weight_decay=0.5, betas=(0.9, 0.98))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    torch.testing.assert_close(model.proj.weight, before["proj.weight"] * (1 - 0.1 * 0.5))
    assert torch.equal(model.embed.weight, before["embed.weight"])
    assert torch.equal(model.norm.weight, before["norm.weight"])


def test_fused_adamw_is_chosen_and_equals_the_reference_loop() -> None:
    """build_optimizer picks torch's fused kernel on the CPU; ten steps of it, with random
    gradients, move every parameter as torch's per-tensor loop (the unfused reference) does."""
    torch.manual_seed(0)
    model = Tied()
    reference = Tied()
    reference.load_state_dict(model.state_dict())
    start = model.proj.weight.detach().clone()
    opt = build_optimizer(model, lr=0.01, weight_decay=0.1, betas=(0.9, 0.98))
    assert all(g["fused"] for g in opt.param_groups)
    ref = torch.optim.AdamW(
        param_groups(reference, 0.1), lr=0.01, betas=(0.9, 0.98), foreach=False, fused=False
    )
    for _ in range(10):
        for p, q in zip(model.parameters(), reference.parameters()):
            if p.requires_grad:
                p.grad = torch.randn_like(p)
                q.grad = p.grad.clone()
        opt.step()
        ref.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6, msg=name)
    assert not torch.equal(model.proj.weight, start)  # the steps did move the weights


def test_fused_adamw_is_refused_for_integer_or_meta_tensors() -> None:
    assert fused_ok([torch.zeros(2)])
    assert not fused_ok([torch.zeros(2), torch.zeros(2, device="meta")])
    assert not fused_ok([torch.zeros(2, dtype=torch.int64)])


SPEEDRUN_TRICKS = {
    "pos": "rope",
    "norm": "rms",
    "activation": "relu2",
    "qk_norm": True,
    "value_embeddings": True,
    "zero_init_proj": True,
    "bias": False,
}


def gpt(tie: bool, tricks: bool) -> nn.Module:
    from attnlab.models.gpt import GPT, GPTConfig

    extra = SPEEDRUN_TRICKS if tricks else {}
    return GPT(GPTConfig(11, context=8, n_layers=2, n_heads=2, d_model=8, tie_weights=tie, **extra))


@pytest.mark.parametrize("tie,tricks", [(True, False), (False, False), (False, True)])
def test_muon_takes_the_hidden_matrices_of_a_gpt(tie: bool, tricks: bool) -> None:
    """Muon: the attention and MLP matrices of every block. AdamW: token, position and value
    embeddings, the output head (tied or not), norm gains (q/k norms too), gates and biases."""
    model = gpt(tie, tricks)
    names = {id(p): n for n, p in model.named_parameters()}
    hidden = {names[id(p)] for p in muon_params(model)}
    expected = {
        f"stack.blocks.{i}.{m}.weight"
        for i in range(2)
        for m in (
            "self_attn.q_proj",
            "self_attn.kv_proj",
            "self_attn.out_proj",
            "ff.w_in",
            "ff.w_out",
        )
    }
    assert hidden == expected
    opt = build_muon_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), muon_lr=0.02)
    muon_groups = [g for g in opt.param_groups if g["use_muon"]]
    adam_groups = [g for g in opt.param_groups if not g["use_muon"]]
    assert len(muon_groups) == 1 and {id(p) for p in muon_groups[0]["params"]} == set(
        map(id, muon_params(model))
    )
    adam = {names[id(p)]: g["weight_decay"] for g in adam_groups for p in g["params"]}
    assert set(adam) | hidden == set(names.values()) and not set(adam) & hidden
    assert adam["tok_emb.weight"] == 0.0 and adam["stack.norm.weight"] == 0.0
    if tricks:
        assert adam["value_emb.weight"] == 0.0 and adam["stack.blocks.1.value_gate"] == 0.0
        assert adam["stack.blocks.0.self_attn.q_norm.weight"] == 0.0
    else:
        assert adam["pos_emb.embedding.weight"] == 0.0
        assert adam["stack.blocks.0.ff.w_in.bias"] == 0.0
    if not tie:  # an untied head is a decayed AdamW matrix
        assert adam["head.weight"] == 0.1
    assert all(g["lr"] == 1e-3 and g["betas"] == (0.9, 0.99) for g in adam_groups)
    assert muon_groups[0]["lr"] == 0.02


def test_muon_classes_of_the_tiny_tagger() -> None:
    """Embedding -> hidden Linear -> output Linear: only `hidden.weight` is Muon's."""
    from _tiny_task import TinyTagger

    model = TinyTagger()
    assert output_head(model) is model.out
    assert [id(p) for p in muon_params(model)] == [id(model.hidden.weight)]


def test_frozen_matrices_are_nobodys() -> None:
    model = Tied()
    opt = build_muon_optimizer(model, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.99), muon_lr=0.02)
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    assert not ids & {id(p) for p in model.frozen.parameters()}
    assert len(ids) == sum(1 for p in model.parameters() if p.requires_grad)


def test_layer_wise_decay_gives_each_depth_its_scale() -> None:
    from attnlab.models.bert import BertClassifier, BertConfig

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=3, context=20)
    model = BertClassifier(cfg, 2)
    model.bert.embeddings.requires_grad_(False)
    depths = model.layer_depths()
    assert depths["head.weight"] == 0 and depths["bert.encoder.blocks.2.ff.w_in.weight"] == 1
    assert depths["bert.encoder.blocks.0.ff.w_in.weight"] == 3
    names = {id(p): n for n, p in model.named_parameters()}
    plain = param_groups(model, 0.01)
    decayed = {id(p) for g in plain if g["weight_decay"] > 0 for p in g["params"]}
    groups = param_groups(model, 0.01, lr_decay=0.8)
    seen = [id(p) for g in groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for g in plain for p in g["params"])  # each once
    for g in groups:
        for p in g["params"]:
            assert g["lr_scale"] == 0.8 ** depths[names[id(p)]]
            assert (g["weight_decay"] > 0) == (id(p) in decayed)
    opt = build_optimizer(model, 1e-3, 0.01, (0.9, 0.999), lr_decay=0.8)
    assert sorted({round(g["lr"], 12) for g in opt.param_groups}) == sorted(
        {round(1e-3 * 0.8**k, 12) for k in (0, 1, 2, 3)}
    )
    assert all("lr_scale" not in g for g in plain)  # lr_decay 1: the groups as before


def test_layer_wise_decay_refuses_a_model_without_depths() -> None:
    from attnlab.errors import UserError

    with pytest.raises(UserError, match="layer_depths"):
        param_groups(Tied(), 0.01, lr_decay=0.9)

    class Partial(Tied):
        def layer_depths(self) -> dict[str, int]:
            return {"proj.weight": 1}

    with pytest.raises(ValueError, match="lacks 'pos'"):
        param_groups(Partial(), 0.01, lr_decay=0.9)
