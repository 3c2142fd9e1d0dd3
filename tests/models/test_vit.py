"""ViT: parity with Hugging Face ViTModel / ViTForImageClassification, positions, rollout."""

from __future__ import annotations

import pytest
import torch

from attnlab.models.vit import ViT, ViTConfig, attention_rollout, rollout_map, sincos_2d_table
from attnlab.verify.checks_hf import hf_vit_config
from attnlab.verify.copy_weights import copy_vit

transformers = pytest.importorskip("transformers")


def _tiny(**kw) -> ViTConfig:
    base = dict(
        image_size=12,
        in_channels=3,
        patch_size=4,
        d_model=32,
        n_layers=2,
        n_heads=4,
        d_ff=64,
        dropout=0.0,
        norm_eps=1e-12,
        n_classes=5,
    )
    return ViTConfig(**(base | kw))


def _hf_pair(cfg: ViTConfig):
    hf = transformers.ViTForImageClassification(hf_vit_config(cfg)).eval()
    # HF initialises cls/position embeddings with zeros-ish tensors: randomise everything.
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
    return hf


def test_matches_hugging_face_vit_hidden_states_attention_and_logits() -> None:
    cfg = _tiny()
    hf = _hf_pair(cfg)
    model = ViT(cfg).eval()
    copy_vit(model, hf)
    images = torch.randn(3, 3, 12, 12)
    with torch.no_grad():
        ref = hf.vit(images, output_hidden_states=True, output_attentions=True)
        ref_logits = hf(images).logits
        ours = model.inspect(images)
        logits = model(images)
    assert len(ours["hidden_states"]) == len(ref.hidden_states) == cfg.n_layers + 1
    for a, b in zip(ours["hidden_states"], ref.hidden_states):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours["last_hidden_state"], ref.last_hidden_state, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours["attention"], torch.stack(ref.attentions), atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours["logits"], ref_logits, atol=1e-5, rtol=1e-5)


def test_patch_embedding_is_flattened_patches_times_a_matrix() -> None:
    cfg = _tiny(in_channels=2)
    model = ViT(cfg)
    images = torch.randn(2, 2, 12, 12)
    p, g = cfg.patch_size, cfg.grid
    # (B, C, G, p, G, p) -> (B, G, G, C, p, p) -> (B, N, C·p·p), rows in row-major patch order
    patches = images.view(2, 2, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(2, g * g, -1)
    w = model.patch_embed.proj.weight.reshape(cfg.d_model, -1)  # (D, C·p·p)
    expected = patches @ w.T + model.patch_embed.proj.bias
    torch.testing.assert_close(model.patch_embed(images), expected, atol=1e-5, rtol=1e-5)


def test_sincos_2d_table_encodes_row_then_column() -> None:
    table = sincos_2d_table(3, 8).view(3, 3, 8)
    # Left half depends on the row only, right half on the column only.
    assert torch.equal(table[1, 0, :4], table[1, 2, :4])
    assert torch.equal(table[0, 2, 4:], table[2, 2, 4:])
    assert not torch.equal(table[0, 0, :4], table[1, 0, :4])
    assert torch.allclose(table[0, 0], torch.tensor([0.0, 1, 0, 1, 0, 1, 0, 1]))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("pos", ["learned", "sincos2d"])
def test_shapes_and_gradients(pooling: str, pos: str) -> None:
    cfg = _tiny(pooling=pooling, pos=pos, in_channels=1)
    model = ViT(cfg)
    trained = [p.requires_grad for p in model.pos_embed.parameters()]
    assert trained == ([True] if pos == "learned" else [])
    x = torch.randn(2, 1, 12, 12)
    logits = model(x)
    assert logits.shape == (2, 5)
    logits.sum().backward()
    assert model.patch_embed.proj.weight.grad.abs().sum() > 0
    info = model.inspect(x)
    assert info["attention"].shape == (2, 2, 4, cfg.n_tokens, cfg.n_tokens)


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    cfg = _tiny()
    a, b = ViT(cfg), ViT(ViTConfig(**(cfg.__dict__ | {"gradient_checkpointing": True})))
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 12, 12)
    a(x).square().sum().backward()
    b(x).square().sum().backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_rollout_matches_a_step_by_step_product() -> None:
    att = torch.softmax(torch.randn(3, 2, 4, 5, 5), dim=-1)  # (L, B, H, T, T)
    expected = []
    for b in range(2):
        r = torch.eye(5)
        for layer in range(3):
            a = 0.5 * att[layer, b].mean(0) + 0.5 * torch.eye(5)
            a = a / a.sum(-1, keepdim=True)
            r = a @ r
        expected.append(r)
    out = attention_rollout(att)
    torch.testing.assert_close(out, torch.stack(expected))
    torch.testing.assert_close(out.sum(-1), torch.ones(2, 5))  # still row-stochastic


def test_rollout_map_finds_the_only_patch_attended_to() -> None:
    cfg = _tiny(n_layers=1)
    model = ViT(cfg).eval()
    attn = model.encoder.blocks[0].self_attn
    target = 1 + 4  # the token of patch (1, 1), after the class token
    marked = torch.arange(cfg.n_heads) * (cfg.d_model // cfg.n_heads)  # one dim in each head
    with torch.no_grad():
        # Zero images and zero positions give zero tokens (so zero keys) everywhere except the
        # target, whose key is large along `marked`; every query is a constant along `marked`.
        model.cls_token.zero_()
        table = model.pos_embed.embedding.weight  # (T, D) learned positions
        table.zero_()
        table[target, marked] = 50.0
        for proj in (attn.q_proj, attn.kv_proj):
            proj.weight.zero_()
            proj.bias.zero_()
        attn.q_proj.bias[marked] = 20.0  # q = const
        attn.kv_proj.weight[: cfg.d_model] = torch.eye(cfg.d_model)  # k = LN(x)
    m = rollout_map(model, torch.zeros(1, 3, 12, 12), residual=0.0)
    assert m.shape == (1, 3, 3)
    assert m[0].argmax().item() == 4 and m[0, 1, 1] > 0.99
    torch.testing.assert_close(m.sum(), torch.tensor(1.0))


def test_bad_shapes_are_value_errors() -> None:
    with pytest.raises(ValueError, match="patch_size"):
        ViTConfig(image_size=28, patch_size=5)
    with pytest.raises(ValueError, match="resize"):
        ViT(_tiny())(torch.randn(1, 3, 16, 16))


def test_conv_stem_keeps_the_token_grid_and_each_token_sees_its_own_patch_region() -> None:
    """stem=conv gives the same (B, N, D) tokens as a patch embedding; token (r, c) depends on
    pixels around its own 4x4 patch only (the receptive field of two 3x3 stride-2 convs)."""
    cfg = _tiny(in_channels=1, patch_size=4, stem="conv", stem_channels=8)
    model = ViT(cfg).eval()
    images = torch.randn(2, 1, 12, 12, requires_grad=True)
    tokens = model.patch_embed(images)
    assert tokens.shape == (2, cfg.grid**2, cfg.d_model)
    tokens[0, 0].sum().backward()  # token of the top-left patch
    touched = images.grad[0, 0].abs() > 0  # (12, 12)
    assert touched[:4, :4].any() and not touched[8:, :].any() and not touched[:, 8:].any()
    assert images.grad[1].abs().sum() == 0  # no mixing across the batch (BatchNorm in eval)
    assert model(images).shape == (2, cfg.n_classes)


def test_conv_stem_needs_a_power_of_two_patch() -> None:
    with pytest.raises(ValueError, match="power of two"):
        _tiny(patch_size=3, image_size=12, stem="conv")


def test_local_attention_wider_than_the_tokens_is_full_attention() -> None:
    full = ViT(_tiny()).eval()
    local = ViT(_tiny(attention="local", window=64)).eval()
    local.load_state_dict(full.state_dict())
    images = torch.randn(2, 3, 12, 12)
    torch.testing.assert_close(local(images), full(images), atol=1e-5, rtol=1e-5)
    narrow = ViT(_tiny(attention="local", window=2, n_global=1)).eval()
    narrow.load_state_dict(full.state_dict())
    assert not torch.allclose(narrow(images), full(images), atol=1e-4)
