"""GPT model, decoding and GPT-2 interop against references.

* GPT-2 layout == ``transformers.GPT2LMHeadModel`` (random init, saved to a temporary directory
  and loaded through ``load_hf_gpt2``): logits to 1e-5 (float32) and 1e-10 (float64), parameter
  gradients, greedy continuations; and the export back loads in ``GPT2LMHeadModel`` unchanged.
* LLaMA layout (RoPE, RMSNorm, SwiGLU, GQA, no biases, untied) == ``LlamaForCausalLM``.
* Decoding with the KV cache == without it: the same logits at every step (also across window
  slides, for learned, rotary and ALiBi positions) and the same greedy text.
* Causality, every attention backend (explicit, fused, flash), the sampling rules (top-k, top-p).
"""

from __future__ import annotations

import math

import pytest
import torch

from _device import DEVICE
from attnlab.infer.generation import Generation, sample_next
from attnlab.interop.hf_gpt2 import config_to_hf, load_hf_gpt2, save_hf_gpt2
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.train import load_weights, save_weights
from attnlab.verify.checks_hf import scramble
from attnlab.verify.copy_weights import copy_links, llama_gpt_links

transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("on_test_device")  # tests/_device.py: ATTNLAB_TEST_DEVICE
F64 = torch.float64
HF_GPT2 = dict(
    vocab_size=71,
    n_positions=40,
    n_embd=48,
    n_layer=3,
    n_head=4,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    bos_token_id=0,
    eos_token_id=0,
)


def tiny(**changes) -> GPTConfig:
    base = dict(vocab_size=53, context=24, n_layers=2, n_heads=4, d_model=32)
    return GPTConfig(**{**base, **changes})


def hf_gpt2(tmp_path, dtype=torch.float32):
    """A random GPT2LMHeadModel saved as config.json + model.safetensors; also our load of it."""
    config = transformers.GPT2Config(**HF_GPT2)
    config._attn_implementation = "eager"
    hf = scramble(transformers.GPT2LMHeadModel(config)).eval()
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    return hf.to(dtype), load_hf_gpt2(tmp_path).to(dtype)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (F64, 1e-10)])
def test_loaded_gpt2_matches_hugging_face_logits_and_gradients(tmp_path, dtype, tol) -> None:
    hf, ours = hf_gpt2(tmp_path, dtype)
    ids = torch.randint(0, HF_GPT2["vocab_size"], (3, 17))
    want = hf(ids).logits
    got = ours(ids)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    cot = torch.randn_like(got)
    (got * cot).sum().backward()
    (want * cot).sum().backward()
    block, ref = ours.stack.blocks[1], hf.transformer.h[1]
    pairs = [
        (block.self_attn.q_proj.weight.grad, ref.attn.c_attn.weight.grad.t()[:48]),
        (block.self_attn.kv_proj.weight.grad, ref.attn.c_attn.weight.grad.t()[48:]),
        (block.ff.w_out.weight.grad, ref.mlp.c_proj.weight.grad.t()),
        (block.norm2.bias.grad, ref.ln_2.bias.grad),
        (ours.tok_emb.weight.grad, hf.transformer.wte.weight.grad),  # embedding + tied head
        (ours.pos_emb.embedding.weight.grad, hf.transformer.wpe.weight.grad),
    ]
    for mine, theirs in pairs:
        torch.testing.assert_close(mine, theirs, rtol=tol * 10, atol=tol * 10)


def test_loaded_gpt2_greedy_continuation_matches_hugging_face_generate(tmp_path) -> None:
    hf, ours = hf_gpt2(tmp_path)
    prompt = torch.randint(0, HF_GPT2["vocab_size"], (2, 5))
    # eos_token_id=None: HF would stop a row at token 0 (the config's eos) and pad it with 0s
    # attention_mask given: without it HF takes every prompt token equal to pad_token_id (0, which
    # a random prompt can hold) for padding and masks it (the flake of seed 1931447424)
    want = hf.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False,
        pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    gen = Generation(ours, prompt)
    for _ in range(30):
        gen.append(sample_next(gen.next_logits(), temperature=0))
    assert torch.equal(gen.ids, want)


def test_export_loads_in_hugging_face_with_equal_logits(tmp_path) -> None:
    ours = scramble(GPT(tiny(d_ff=80, activation="gelu_tanh"))).eval()
    save_hf_gpt2(ours, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).to(DEVICE).eval()
    assert hf.config.n_inner == 80 and hf.config.tie_word_embeddings
    ids = torch.randint(0, 53, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)
    again = load_hf_gpt2(tmp_path)  # and back: the very same weights
    for (name, a), b in zip(ours.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_broken_gpt2_directory_is_a_one_line_error_naming_the_file(tmp_path) -> None:
    save_hf_gpt2(GPT(tiny()), tmp_path)
    weights, config = tmp_path / "model.safetensors", tmp_path / "config.json"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated or not a safetensors file") as err:
        load_hf_gpt2(tmp_path)
    assert str(weights) in str(err.value) and "\n" not in str(err.value)
    config.write_text(config.read_text()[:-5])
    with pytest.raises(ValueError, match="config.json: not a valid JSON file"):
        load_hf_gpt2(tmp_path)


def test_export_refuses_what_gpt2_cannot_express() -> None:
    with pytest.raises(ValueError, match="pos='learned'.*n_kv_heads=0"):
        config_to_hf(tiny(pos="rope", n_kv_heads=2))


def test_llama_layout_matches_hugging_face_llama() -> None:
    config = transformers.LlamaConfig(
        vocab_size=61,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config._attn_implementation = "sdpa"
    hf = scramble(transformers.LlamaForCausalLM(config)).to(F64).eval()
    cfg = GPTConfig(
        vocab_size=61,
        context=64,
        n_layers=2,
        n_heads=6,
        n_kv_heads=2,
        d_model=48,
        d_ff=96,
        pos="rope",
        norm="rms",
        activation="swiglu",
        bias=False,
        tie_weights=False,
        norm_eps=1e-6,
    )
    ours = GPT(cfg).to(F64).eval()
    copy_links(llama_gpt_links(ours, hf))
    ids = torch.randint(0, 61, (2, 19))
    with torch.no_grad():
        # HF's RMSNorm rounds through float32, so float64 agrees to ~1e-6 relative only
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- decoding


LAYOUTS = {
    "learned": dict(pos="learned"),
    "rope-gqa": dict(pos="rope", n_kv_heads=2, norm="rms", activation="swiglu", bias=False),
    "alibi": dict(pos="alibi", tie_weights=False),
    "sinusoidal": dict(pos="sinusoidal"),
    "t5": dict(pos="t5"),
    "nope": dict(pos="none", norm="dyt"),
    "rope-pi": dict(pos="rope", rope_scaling="linear", rope_factor=4.0),
    "rope-ntk": dict(pos="rope", rope_scaling="ntk", rope_factor=4.0),
    "sliding-window": dict(pos="rope", attention="local", window=6),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cached_and_uncached_decoding_agree_step_by_step(layout) -> None:
    """60 steps with a context of 24: the window slides twice; logits agree at every step."""
    model = scramble(GPT(tiny(**LAYOUTS[layout]))).to(F64).eval()
    prompt = torch.randint(0, 53, (3, 7))
    cached, uncached = Generation(model, prompt, True), Generation(model, prompt, False)
    for step in range(60):
        a, b = cached.next_logits(), uncached.next_logits()
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"step {step}")
        tokens = sample_next(a, temperature=0)
        cached.append(tokens)
        uncached.append(tokens)
    assert cached.start > 0  # the window did slide


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cached_greedy_text_equals_uncached_in_float32(layout) -> None:
    model = scramble(GPT(tiny(**LAYOUTS[layout]))).eval()
    prompt = torch.randint(0, 53, (2, 5))
    runs = []
    for use_cache in (True, False):
        gen = Generation(model, prompt, use_cache)
        for _ in range(50):
            gen.append(sample_next(gen.next_logits(), temperature=0))
        runs.append(gen.ids)
    assert torch.equal(*runs)


def test_cache_prefill_of_a_window_matches_full_forward() -> None:
    model = scramble(GPT(tiny(pos="alibi"))).to(F64).eval()
    ids = torch.randint(0, 53, (2, 20))
    caches = model.new_caches()
    with torch.no_grad():
        parts = [model(ids[:, :8], caches), model(ids[:, 8:9], caches), model(ids[:, 9:], caches)]
        want = model(ids)
    torch.testing.assert_close(torch.cat(parts, dim=1), want, rtol=1e-10, atol=1e-10)


def test_keep_drops_rows_from_ids_and_caches() -> None:
    model = scramble(GPT(tiny())).to(F64).eval()
    prompt = torch.randint(0, 53, (3, 4))
    gen = Generation(model, prompt)
    gen.append(sample_next(gen.next_logits(), temperature=0))
    gen.keep(torch.tensor([2, 0]))
    alone = Generation(model, gen.ids, use_cache=False)
    torch.testing.assert_close(gen.next_logits(), alone.next_logits(), rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- the model


@pytest.mark.parametrize("layout", LAYOUTS)
def test_logits_never_depend_on_later_tokens(layout) -> None:
    model = scramble(GPT(tiny(**LAYOUTS[layout]))).to(F64).eval()
    ids = torch.randint(0, 53, (2, 24))
    cut = int(torch.randint(1, 23, ()))
    changed = ids.clone()
    changed[:, cut:] = torch.randint(0, 53, (2, 24 - cut))
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :cut], b[:, :cut], rtol=0, atol=1e-12)
    assert not torch.allclose(a[:, cut:], b[:, cut:])


@pytest.mark.parametrize("layout", [name for name in LAYOUTS if "attention" not in LAYOUTS[name]])
def test_every_backend_gives_the_fused_kernels_logits(layout) -> None:
    model = scramble(GPT(tiny(**LAYOUTS[layout]))).to(F64).eval()
    ids = torch.randint(0, 53, (2, 24))
    with torch.no_grad():
        fused = model(ids)
    for backend in ("explicit", "flash"):
        other = GPT(tiny(**LAYOUTS[layout], backend=backend)).to(F64).eval()
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(other(ids), fused, rtol=1e-10, atol=1e-10, msg=backend)


def test_last_only_and_context_limit() -> None:
    model = GPT(tiny()).eval()
    ids = torch.randint(0, 53, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, last_only=True), model(ids)[:, -1:])
    with pytest.raises(ValueError, match="exceed the model's context of 24"):
        model(torch.randint(0, 53, (1, 25)))


def test_tied_weights_share_storage_and_survive_save_and_load(tmp_path) -> None:
    model = scramble(GPT(tiny()))
    assert model.head.weight is model.tok_emb.weight
    untied = GPT(tiny(tie_weights=False))
    assert untied.head.weight is not untied.tok_emb.weight
    save_weights(model, tmp_path / "m.safetensors")
    other = GPT(tiny())
    load_weights(other, tmp_path / "m.safetensors")
    assert other.head.weight is other.tok_emb.weight
    ids = torch.randint(0, 53, (1, 10))
    with torch.no_grad():
        assert torch.equal(model(ids), other(ids))


def test_gpt2_init_scales_residual_projections() -> None:
    model = GPT(tiny(n_layers=8, d_model=256, n_heads=4, vocab_size=300))
    std = model.stack.blocks[0].ff.w_out.weight.std().item()
    assert abs(std - 0.02 / 4) < 0.001  # 0.02 / sqrt(2 * 8)
    assert abs(model.stack.blocks[0].ff.w_in.weight.std().item() - 0.02) < 0.002


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(vocab_size=0), "vocab_size must be set"),
        (dict(pos="xpos"), "pos must be one of learned, rope, alibi, sinusoidal, t5, none"),
        (dict(n_heads=5), "not divisible by n_heads=5"),
        (dict(n_kv_heads=3), "multiple of n_kv_heads=3"),
        (dict(activation="tanh"), "activation must be one of"),
    ],
)
def test_bad_config_says_what_to_change(changes, message) -> None:
    with pytest.raises(ValueError, match=message):
        GPT(tiny(**changes))


def test_swiglu_width_follows_llama() -> None:
    assert tiny(d_model=192, activation="swiglu").ff_width == 512
    assert tiny(d_model=192).ff_width == 768


# --------------------------------------------------------------------------- sampling


def test_greedy_is_argmax_and_sampling_is_seeded() -> None:
    logits = torch.randn(4, 30)
    assert torch.equal(sample_next(logits, temperature=0), logits.argmax(-1))
    seeded = [torch.Generator(DEVICE).manual_seed(7) for _ in range(2)]
    draws = [sample_next(logits, 1.0, generator=g) for g in seeded]
    assert torch.equal(*draws)


def test_top_k_and_top_p_only_sample_allowed_tokens() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log().repeat(2000, 1)
    gen = torch.Generator(DEVICE).manual_seed(0)
    top_k = sample_next(logits, 1.0, top_k=2, generator=gen)
    assert set(top_k.tolist()) == {0, 1}
    top_p = sample_next(logits, 1.0, top_p=0.8, generator=gen)  # 0.5 + 0.3 reaches 0.8
    assert set(top_p.tolist()) == {0, 1}
    top_p = sample_next(logits, 1.0, top_p=0.81, generator=gen)
    assert set(top_p.tolist()) == {0, 1, 2}
    tiny_p = sample_next(logits, 1.0, top_p=1e-6, generator=gen)  # the top token always stays
    assert set(tiny_p.tolist()) == {0}
    share = (top_k == 0).float().mean().item()  # renormalised: 0.5 / 0.8
    assert abs(share - 0.625) < 0.05


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-1), "temperature must be >= 0"),
        (dict(top_k=-2), "top-k must be >= 0"),
        (dict(top_p=0.0), "top-p must be in"),
    ],
)
def test_bad_sampling_settings_raise(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        sample_next(torch.randn(1, 5), **kwargs)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi", "t5", "none"])
def test_every_pos_choice_prefills_in_pieces_like_the_full_forward(pos) -> None:
    model = scramble(GPT(tiny(pos=pos))).to(F64).eval()
    ids = torch.randint(0, 53, (2, 20))
    caches = model.new_caches()
    with torch.no_grad():
        parts = [model(ids[:, :8], caches), model(ids[:, 8:9], caches), model(ids[:, 9:], caches)]
        want = model(ids)
    torch.testing.assert_close(torch.cat(parts, dim=1), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("pos", ["sinusoidal", "rope", "alibi", "t5", "none"])
def test_positions_without_a_table_run_past_the_trained_length(pos) -> None:
    """The same weights in a model built with a 4x context: the first 24 positions unchanged."""
    short = scramble(GPT(tiny(pos=pos))).to(F64).eval()
    long = GPT(tiny(pos=pos, context=96)).to(F64).eval()
    long.load_state_dict(short.state_dict())
    ids = torch.randint(0, 53, (2, 96))
    with torch.no_grad():
        torch.testing.assert_close(long(ids)[:, :24], short(ids[:, :24]), rtol=1e-10, atol=1e-10)


def test_the_learned_table_refuses_positions_past_its_context() -> None:
    """Decided: refuse, never clamp. Past ``context`` the forward stops with a clear line, and
    the trained table cannot be loaded into a model built for a longer context."""
    model = GPT(tiny(pos="learned"))
    with pytest.raises(ValueError, match="exceed the model's context of 24"):
        model(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(RuntimeError, match="pos_emb.embedding.weight"):
        GPT(tiny(pos="learned", context=48)).load_state_dict(model.state_dict())


def test_t5_and_alibi_refuse_linear_attention_and_nope_counts_every_parameter() -> None:
    with pytest.raises(ValueError, match="pos='t5' adds a bias"):
        tiny(pos="t5", attention="linear").validate()
    model = GPT(tiny(pos="sinusoidal"))
    assert model.num_params() == GPT(tiny(pos="none")).num_params()


def test_sinusoidal_positions_scale_the_embeddings_as_vaswani() -> None:
    """Vaswani §3.4: the stack sees E[ids]·√d + PE(pos)."""
    from attnlab.layers.positions import sinusoid_table

    model = GPT(tiny(pos="sinusoidal")).eval()
    seen = {}
    model.stack.blocks[0].register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    ids = torch.randint(0, 53, (2, 10))
    model(ids)
    want = model.tok_emb(ids) * math.sqrt(32) + sinusoid_table(10, 32)
    torch.testing.assert_close(seen["x"], want)


def test_a_dyt_gpt_feeds_its_blocks_unit_scale_inputs():
    """DyT has no statistics to rescale GPT-2's N(0, 0.02) embeddings: a learned gain starting at
    1/0.02 brings them to unit scale (the DyT authors' LLaMA does this with √d), and learns."""
    cfg = GPTConfig(vocab_size=50, context=16, n_layers=2, n_heads=2, d_model=32, norm="dyt")
    model = GPT(cfg)
    seen: list[torch.Tensor] = []
    model.stack.blocks[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    ids = torch.randint(0, 50, (4, 16))
    model(ids).sum().backward()
    rms = seen[0].pow(2).mean().sqrt().item()
    assert 0.7 < rms < 1.5, rms  # the token embeddings at unit scale (plus learned positions)
    assert model.emb_gain.grad is not None and model.emb_gain.grad.abs() > 0
    assert (
        GPT(GPTConfig(vocab_size=50, context=16, n_layers=1, n_heads=2, d_model=32)).emb_gain
        is None
    )
