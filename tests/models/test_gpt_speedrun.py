"""The speedrun switches of GPTConfig, each against a reference nobody here wrote
or a hand-written float64 formula:

* ``qk_norm``: a pre-norm block == a step-by-step float64 computation (RMSNorm of each head's
  q and k over Dh, then RoPE, then causal softmax attention); a GPT with it == Hugging Face
  ``Qwen3ForCausalLM`` (per-head q_norm/k_norm before RoPE) with copied weights;
* ``activation = "relu2"``: W2 · max(W1 x + b1, 0)² + b2 in float64, and gradcheck;
* ``zero_init_proj``: every block is the identity at init, and gradients still reach the
  zeroed projections;
* ``value_embeddings``: for a sequence of one repeated token the value embedding is a constant,
  so the model equals one without it whose value bias holds λ · E[token];
* ``logit_softcap``: c · tanh(z / c) of the uncapped logits, bounded by c;
* every switch, alone and all together: KV-cache decoding == full recompute (60 steps, the
  window slides), and weights survive save/load.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.infer.generation import Generation, sample_next
from attnlab.interop.hf_gpt2 import config_to_hf
from attnlab.layers.blocks import Block, BlockConfig, FeedForward
from attnlab.layers.positions import RotaryEmbedding
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.train import load_weights, save_weights
from attnlab.verify.checks_hf import scramble
from attnlab.verify.copy_weights import copy_links, llama_gpt_links

transformers = pytest.importorskip("transformers")
F64 = torch.float64
TIGHT = dict(rtol=1e-10, atol=1e-10)


def tiny(**changes) -> GPTConfig:
    base = dict(vocab_size=53, context=24, n_layers=2, n_heads=4, d_model=32)
    return GPTConfig(**{**base, **changes})


# --------------------------------------------------------------------------- qk_norm


def _rms(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def _rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate channel pairs (i, i + Dh/2) at position t by t·base^(-2i/Dh): x (B, H, T, Dh)."""
    T, Dh = x.shape[-2], x.shape[-1]
    half = Dh // 2
    theta = base ** (-torch.arange(half, dtype=F64) * 2 / Dh)  # (Dh/2,)
    angle = torch.arange(T, dtype=F64)[:, None] * theta[None]  # (T, Dh/2)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def test_qk_norm_block_matches_a_hand_written_float64_reference() -> None:
    D, H, Hkv, T, B, eps = 32, 4, 2, 9, 2, 1e-6
    Dh = D // H
    cfg = BlockConfig(
        D, H, 48, n_kv_heads=Hkv, dropout=0.0, activation="swiglu", norm="rms",
        norm_position="pre", norm_eps=eps, bias=False, qk_norm=True,
    )  # fmt: skip
    block = scramble(Block(cfg, RotaryEmbedding(Dh))).to(F64)
    x = torch.randn(B, T, D, dtype=F64)
    got, _ = block(x, is_causal=True)
    a = block.self_attn
    h = _rms(x, block.norm1.weight, eps)
    q = h @ a.q_proj.weight.T
    k, v = (h @ a.kv_proj.weight.T).chunk(2, dim=-1)
    q = q.view(B, T, H, Dh).transpose(1, 2)
    k = k.view(B, T, Hkv, Dh).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    v = v.view(B, T, Hkv, Dh).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    q = _rope(_rms(q, a.q_norm.weight, eps))  # norm first, then rotate
    k = _rope(_rms(k, a.k_norm.weight, eps))
    scores = q @ k.transpose(-1, -2) / math.sqrt(Dh)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    attn = scores.softmax(-1) @ v  # (B, H, T, Dh)
    x1 = x + attn.transpose(1, 2).reshape(B, T, D) @ a.out_proj.weight.T
    gate, up = (_rms(x1, block.norm2.weight, eps) @ block.ff.w_in.weight.T).chunk(2, dim=-1)
    want = x1 + (F.silu(gate) * up) @ block.ff.w_out.weight.T
    # RotaryEmbedding keeps its cos/sin tables in float32: agreement to ~1e-7, not 1e-12
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_qk_norm_gpt_matches_hugging_face_qwen3() -> None:
    config = transformers.Qwen3Config(
        vocab_size=61,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config._attn_implementation = "sdpa"
    hf = scramble(transformers.Qwen3ForCausalLM(config)).eval()
    cfg = GPTConfig(
        vocab_size=61, context=64, n_layers=2, n_heads=6, n_kv_heads=2, d_model=48, d_ff=96,
        pos="rope", norm="rms", activation="swiglu", bias=False, tie_weights=False,
        norm_eps=1e-6, qk_norm=True,
    )  # fmt: skip
    ours = GPT(cfg).eval()
    copy_links(llama_gpt_links(ours, hf))
    ids = torch.randint(0, 61, (2, 19))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)
        without = GPT(GPTConfig(**{**cfg.__dict__, "qk_norm": False})).eval()
        without.load_state_dict(ours.state_dict(), strict=False)
        assert not torch.allclose(without(ids), hf(ids).logits, atol=1e-3)  # the switch matters


# --------------------------------------------------------------------------- relu2


def test_relu2_is_squared_relu() -> None:
    ff = scramble(FeedForward(6, 10, "relu2")).to(F64)
    x = torch.randn(4, 3, 6, dtype=F64)
    h = x @ ff.w_in.weight.T + ff.w_in.bias
    want = torch.where(h > 0, h * h, torch.zeros_like(h)) @ ff.w_out.weight.T + ff.w_out.bias
    torch.testing.assert_close(ff(x), want, **TIGHT)
    assert torch.autograd.gradcheck(ff, (x.requires_grad_(),))


# --------------------------------------------------------------------------- zero_init_proj


def test_zero_init_makes_every_block_the_identity_and_still_learns() -> None:
    model = GPT(tiny(zero_init_proj=True, n_layers=3))
    outputs = []
    for block in model.stack.blocks:
        block.register_forward_hook(lambda m, args, out: outputs.append((args[0], out[0])))
    ids = torch.randint(0, 53, (2, 10))
    logits = model(ids)
    assert len(outputs) == 3
    for x_in, x_out in outputs:
        assert torch.equal(x_in, x_out)
    x0 = model.tok_emb(ids) + model.pos_emb.embedding.weight[:10]
    torch.testing.assert_close(logits, model.head(model.stack.norm(x0)))
    logits.logsumexp(-1).mean().backward()
    for block in model.stack.blocks:
        assert block.self_attn.out_proj.weight.grad.abs().sum() > 0
        assert block.ff.w_out.weight.grad.abs().sum() > 0
    default = GPT(tiny())
    assert default.stack.blocks[0].ff.w_out.weight.abs().sum() > 0


# --------------------------------------------------------------------------- value embeddings


def test_value_embeddings_of_one_repeated_token_act_as_a_value_bias() -> None:
    """With every token the same, E[ids] is constant over positions, so v = x W_v + λ E[t]
    equals a model without value embeddings whose value bias is b_v + λ E[t]."""
    cfg = tiny(value_embeddings=True, n_kv_heads=2)
    model = scramble(GPT(cfg)).to(F64).eval()
    plain = GPT(tiny(n_kv_heads=2)).to(F64).eval()
    state = {k: v for k, v in model.state_dict().items() if "value" not in k}
    plain.load_state_dict(state)
    token, T = 7, 11
    kv = 2 * (cfg.d_model // cfg.n_heads)
    with torch.no_grad():
        for mine, ref in zip(model.stack.blocks, plain.stack.blocks, strict=True):
            ref.self_attn.kv_proj.bias[-kv:] += mine.value_gate * model.value_emb.weight[token]
        ids = torch.full((2, T), token)
        torch.testing.assert_close(model(ids), plain(ids), **TIGHT)
        mixed = torch.randint(0, 53, (2, T))
        assert not torch.allclose(model(mixed), plain(mixed))


# --------------------------------------------------------------------------- logit softcap


def test_logit_softcap_is_tanh_of_the_uncapped_logits() -> None:
    capped = scramble(GPT(tiny(logit_softcap=2.5))).to(F64)
    plain = GPT(tiny()).to(F64)
    plain.load_state_dict(capped.state_dict())
    ids = torch.randint(0, 53, (3, 12))
    z, got = plain(ids), capped(ids)
    torch.testing.assert_close(got, 2.5 * torch.tanh(z / 2.5), **TIGHT)
    assert z.abs().max() > 2.5 > got.abs().max()


# --------------------------------------------------------------------------- all of them


SWITCHES = {
    "qk_norm": dict(qk_norm=True, pos="rope"),
    "relu2": dict(activation="relu2"),
    "value_embeddings": dict(value_embeddings=True, n_kv_heads=2),
    "zero_init_proj": dict(zero_init_proj=True),
    "logit_softcap": dict(logit_softcap=3.0),
    "all": dict(
        qk_norm=True,
        pos="rope",
        activation="relu2",
        value_embeddings=True,
        n_kv_heads=2,
        zero_init_proj=True,
        logit_softcap=3.0,
        tie_weights=False,
        norm="rms",
        bias=False,
    ),  # fmt: skip
    "all-local": dict(
        qk_norm=True,
        activation="relu2",
        value_embeddings=True,
        logit_softcap=3.0,
        attention="local",
        window=5,
    ),  # fmt: skip
}


@pytest.mark.parametrize("switch", SWITCHES)
def test_cached_decoding_equals_full_recompute(switch: str) -> None:
    """40 steps with a context of 24: the window slides; logits agree at every step."""
    model = scramble(GPT(tiny(**SWITCHES[switch]))).to(F64).eval()
    prompt = torch.randint(0, 53, (2, 7))
    cached, uncached = Generation(model, prompt, True), Generation(model, prompt, False)
    for step in range(40):
        a, b = cached.next_logits(), uncached.next_logits()
        torch.testing.assert_close(a, b, **TIGHT, msg=f"step {step}")
        tokens = sample_next(a, temperature=0)
        cached.append(tokens)
        uncached.append(tokens)
    assert cached.start > 0


def test_all_switches_survive_save_and_load_and_refuse_gpt2_export(tmp_path) -> None:
    cfg = tiny(**SWITCHES["all"])
    model = scramble(GPT(cfg))
    save_weights(model, tmp_path / "m.safetensors")
    other = GPT(cfg)
    load_weights(other, tmp_path / "m.safetensors")
    ids = torch.randint(0, 53, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids), other(ids))
    with pytest.raises(ValueError, match="qk_norm=false.*value_embeddings=false.*softcap=0"):
        config_to_hf(tiny(qk_norm=True, value_embeddings=True, logit_softcap=1.0))
    with pytest.raises(ValueError, match="activation='gelu'"):
        config_to_hf(tiny(activation="relu2"))


def test_gradient_checkpointing_passes_the_value_embeddings() -> None:
    cfg = tiny(value_embeddings=True, dropout=0.0)
    a = scramble(GPT(cfg)).to(F64)
    b = GPT(GPTConfig(**{**cfg.__dict__, "gradient_checkpointing": True})).to(F64)
    b.load_state_dict(a.state_dict())
    ids = torch.randint(0, 53, (2, 10))
    a(ids).square().mean().backward()
    b.train()(ids).square().mean().backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, **TIGHT, msg=name)
    assert a.value_emb.weight.grad.abs().sum() > 0
