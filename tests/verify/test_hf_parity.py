"""attnlab pieces assembled into known models == Hugging Face transformers with copied weights.

* LLaMA: nn.Embedding + BlockStack of Blocks (RMSNorm, SwiGLU, no biases, pre-norm, GQA,
  RoPE, causal) + final RMSNorm == ``transformers.LlamaModel`` on a tiny random config: hidden
  states and every parameter gradient, float32 (eager and sdpa attention) and float64, with
  left padding (compared on real tokens; see ``test_llama_matches_hugging_face``).
* T5: ``t5_relative_bucket`` == ``T5Attention._relative_position_bucket`` and
  ``T5RelativePositionBias`` == ``T5Attention.compute_bias`` (encoder: bidirectional, decoder:
  unidirectional, several (Tq, Tk), past tokens), gradients included; and MultiHeadAttention
  with that bias == a whole ``T5Attention`` layer.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.layers.attention import MultiHeadAttention
from attnlab.layers.blocks import BlockStack
from attnlab.layers.positions import T5RelativePositionBias, t5_relative_bucket
from attnlab.verify.checks_hf import llama_stack_pair
from attnlab.verify.copy_weights import (
    Link,
    assert_grads_match,
    copy_links,
    copy_t5_attention,
)

transformers = pytest.importorskip("transformers")
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("on_test_device")  # tests/_device.py: ATTNLAB_TEST_DEVICE

F64 = torch.float64


# --------------------------------------------------------------------------- LLaMA


LLAMA = dict(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)


def llama_pair(
    dtype: torch.dtype, attn: str
) -> tuple[nn.Module, nn.Embedding, BlockStack, list[Link]]:
    config = transformers.LlamaConfig(**LLAMA)
    config._attn_implementation = attn
    hf, embedding, stack, links = llama_stack_pair(transformers, config)
    hf, embedding, stack = hf.to(dtype), embedding.to(dtype), stack.to(dtype)
    if dtype == F64:
        _float64_norms(hf)
    return hf, embedding, stack, links


def _float64_norms(hf: nn.Module) -> None:
    """Swap HF's LlamaRMSNorm, which rounds through float32 whatever the input dtype, for
    ``torch.nn.RMSNorm`` (the same formula in the input's dtype) holding the same weight, so
    that the float64 comparison can be tight. Nothing else of HF's model changes."""
    for parent in [hf, *hf.layers]:
        for name, child in list(parent.named_children()):
            if type(child).__name__ == "LlamaRMSNorm":
                norm = nn.RMSNorm(child.weight.shape[0], eps=child.variance_epsilon, dtype=F64)
                norm.weight = child.weight  # the very Parameter the links point at
                setattr(parent, name, norm)


@pytest.mark.parametrize(
    "dtype, attn, tol",
    [
        (torch.float32, "eager", dict(rtol=1e-5, atol=1e-5)),
        (torch.float32, "sdpa", dict(rtol=1e-5, atol=1e-5)),
        # HF's eager path softmaxes in float32 even for float64 inputs: sdpa for the tight check
        (F64, "sdpa", dict(rtol=1e-10, atol=1e-12)),
    ],
)
def test_llama_matches_hugging_face(dtype: torch.dtype, attn: str, tol: dict) -> None:
    """Hidden states and gradients of LlamaModel, with and without left padding.

    With left padding HF keeps ``position_ids = arange(T)`` (pads take positions too), as
    attnlab's RoPE does, so the real tokens see the same rotations in both. Each real query
    attends only to real keys at or before it; the pad queries attend to nothing, and each model
    fills those rows its own way (attnlab: zeros; HF: whatever its mask path gives), so the
    comparison is restricted to real tokens: outputs there, and gradients of a loss on them
    (pad rows feed no real row, so they get no gradient in either model).
    """
    hf, embedding, stack, links = llama_pair(dtype, attn)
    B, T = 3, 11
    ids = torch.randint(0, LLAMA["vocab_size"], (B, T))
    for pads in (None, torch.tensor([0, 3, 7])):
        attention_mask = None if pads is None else (torch.arange(T)[None] >= pads[:, None])
        real = torch.ones(B, T, dtype=torch.bool) if pads is None else attention_mask
        for p in (*hf.parameters(), *embedding.parameters(), *stack.parameters()):
            p.grad = None
        want = hf(
            input_ids=ids, attention_mask=None if pads is None else attention_mask.long()
        ).last_hidden_state
        mask = None if attention_mask is None else attention_mask[:, None, None, :]
        got = stack(embedding(ids), mask, is_causal=True)
        assert got.dtype == dtype
        torch.testing.assert_close(got[real], want[real], **tol)
        assert torch.isfinite(got).all()
        cot = torch.randn(B, T, LLAMA["hidden_size"], dtype=dtype) * real[..., None]
        (got * cot).sum().backward()
        (want * cot).sum().backward()
        assert_grads_match(links, rtol=tol["rtol"] * 10, atol=tol["atol"] * 10)


def test_llama_kv_cache_decoding_matches_hugging_face_full_forward() -> None:
    """Greedy-style decoding through attnlab's caches == LlamaModel on the whole sequence."""
    from attnlab.layers.attention import KVCache

    hf, embedding, stack, _ = llama_pair(F64, "sdpa")
    ids = torch.randint(0, LLAMA["vocab_size"], (2, 9))
    with torch.no_grad():
        want = hf(input_ids=ids).last_hidden_state
        caches = [KVCache() for _ in stack.blocks]
        outs = [stack(embedding(ids[:, :4]), is_causal=True, caches=caches)]
        outs += [
            stack(embedding(ids[:, t : t + 1]), is_causal=True, caches=caches) for t in range(4, 9)
        ]
    torch.testing.assert_close(torch.cat(outs, dim=1), want, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- T5


def t5_config(is_decoder: bool, num_buckets: int = 8, max_distance: int = 20):
    config = transformers.T5Config(
        d_model=24,
        d_kv=6,
        num_heads=4,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=is_decoder,
        dropout_rate=0.0,
    )
    config._attn_implementation = "eager"
    return config


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (10, 7), (6, 64)])
def test_t5_bucket_matches_hugging_face(
    bidirectional: bool, num_buckets: int, max_distance: int
) -> None:
    relative = torch.arange(-400, 401)[None, :] + torch.randint(-3, 4, (5, 1))
    got = t5_relative_bucket(relative, bidirectional, num_buckets, max_distance)
    want = T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    assert torch.equal(got, want)
    assert got.min() >= 0 and got.max() < num_buckets


@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_relative_bias_matches_compute_bias(is_decoder: bool) -> None:
    config = t5_config(is_decoder)
    hf = T5Attention(config, has_relative_attention_bias=True, layer_idx=0).double()
    ours = T5RelativePositionBias(
        config.num_heads,
        config.relative_attention_num_buckets,
        config.relative_attention_max_distance,
        bidirectional=not is_decoder,
    ).double()
    links = [Link(ours.embedding.weight, (hf.relative_attention_bias.weight,), name="bias")]
    copy_links(links)
    for t_q, t_k in [(1, 1), (6, 6), (1, 40), (4, 31), (33, 33), (2, 90)]:
        for past in (t_k - t_q, 0):  # attnlab's default: the queries are the last Tq positions
            got = ours(t_q, t_k) if past == t_k - t_q else ours(t_q, t_k, offset=past)
            want = hf.compute_bias(t_q, t_k, past_seen_tokens=past)
            assert got.shape == (1, config.num_heads, t_q, t_k)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            ours.embedding.weight.grad = hf.relative_attention_bias.weight.grad = None
            cot = torch.randn_like(want)
            (got * cot).sum().backward()
            (want * cot).sum().backward()
            assert_grads_match(links)


@pytest.mark.parametrize("is_decoder", [False, True])
def test_mha_with_t5_bias_matches_t5_attention_layer(is_decoder: bool) -> None:
    """T5 self-attention: no 1/sqrt(d) scaling, so the query weights absorb sqrt(d_kv)."""
    config = t5_config(is_decoder)
    hf = T5Attention(config, has_relative_attention_bias=True, layer_idx=0).double()
    d, H, dk = config.d_model, config.num_heads, config.d_kv
    mha = MultiHeadAttention(d, H, head_dim=dk, bias=False).double()
    bias = T5RelativePositionBias(H, 8, 20, bidirectional=not is_decoder).double()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.4)
    copy_t5_attention(mha, bias, hf)
    B, T = 2, 9
    x = torch.randn(B, T, d, dtype=F64)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    hf_mask = torch.zeros(1, 1, T, T, dtype=F64).masked_fill(~causal, float("-inf"))
    want = hf(x, mask=hf_mask if is_decoder else None)[0]
    for need_weights in (False, True):
        got, _ = mha(x, is_causal=is_decoder, bias=bias(T, T), need_weights=need_weights)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
