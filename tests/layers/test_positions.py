"""attnlab.layers.positions against the formulas of the papers and Hugging Face's implementations.

* sinusoidal table == Vaswani et al.'s formula computed here with ``math`` (odd widths too),
  the module adds it at an offset and extends itself past ``context``;
* learned positions: reaching past ``context`` is a ValueError naming ``context``;
* RoPE == Hugging Face ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb`` (values and
  gradients, offsets, Tq != Tk, beyond the built table) and scores depend on m - n only;
* ALiBi slopes == the paper's reference code and BLOOM's ``_get_alibi_slopes``; the bias gives
  the same causal attention as BLOOM's key-position form; T5 parity is in verify/test_hf_parity.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.layers.attention import scaled_dot_product_attention
from attnlab.layers.positions import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    rotate_half,
    sinusoid_table,
)

F64 = torch.float64


# --------------------------------------------------------------------------- sinusoidal


def formula_table(n_positions: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    rows = []
    for pos in range(n_positions):
        row = []
        for j in range(d_model):
            angle = pos / 10000 ** ((j - j % 2) / d_model)
            row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows, dtype=F64)


@pytest.mark.parametrize("d_model", [2, 7, 16, 33])
def test_sinusoid_table_matches_the_formula(d_model: int) -> None:
    table = sinusoid_table(50, d_model)
    assert table.shape == (50, d_model) and table.dtype == torch.float32
    torch.testing.assert_close(table.double(), formula_table(50, d_model), rtol=0, atol=1e-6)
    if d_model % 2:  # the odd last channel is a sine
        expected_last = torch.sin(torch.arange(50.0) / 10000 ** ((d_model - 1) / d_model))
        torch.testing.assert_close(table[:, -1], expected_last, rtol=0, atol=1e-6)


def test_sinusoidal_module_adds_at_offset_and_extends() -> None:
    pe = SinusoidalPositionalEncoding(10, context=8)
    x = torch.randn(2, 5, 10)
    torch.testing.assert_close(pe(x, offset=2), x + formula_table(7, 10)[2:].float())
    far = pe(torch.zeros(1, 4, 10), offset=20)  # past context: the table grows
    torch.testing.assert_close(far[0], formula_table(24, 10)[20:].float(), rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- learned


def test_learned_positions_and_context_error() -> None:
    emb = LearnedPositionalEmbedding(context=6, d_model=4)
    x = torch.randn(2, 4, 4)
    torch.testing.assert_close(emb(x, offset=2), x + emb.embedding.weight[2:6])
    with pytest.raises(ValueError, match=r"context=6") as info:
        emb(torch.randn(1, 7, 4))
    assert "truncate inputs to 6 tokens" in str(info.value)
    with pytest.raises(ValueError, match=r"reaches position 7 .*context=6"):
        emb(x, offset=3)


# --------------------------------------------------------------------------- RoPE


def hf_rope(head_dim: int, base: float = 10000.0):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = transformers.LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": base},
    )
    return LlamaRotaryEmbedding(config), apply_rotary_pos_emb


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize(
    "t_q, t_k, offset", [(5, 5, 0), (1, 1, 9), (3, 3, 17), (2, 6, 4), (4, 4, 3000)]
)
def test_rope_matches_hugging_face(t_q: int, t_k: int, offset: int, dtype: torch.dtype) -> None:
    head_dim, base = 8, 500.0
    hf_emb, hf_apply = hf_rope(head_dim, base)
    rope = RotaryEmbedding(head_dim, base=base, context=64)  # offset 3000: the table is rebuilt
    q = torch.randn(2, 4, t_q, head_dim, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, t_k, head_dim, dtype=dtype, requires_grad=True)
    got_q, got_k = rope(q, k, offset)

    pos_k = torch.arange(offset, offset + t_k)[None]  # (1, Tk): new keys start at offset
    cos, sin = hf_emb(k, pos_k)
    # The queries are the last Tq of those positions (bottom-right, like the causal mask).
    _, want_k = hf_apply(k, k, cos, sin)
    want_q, _ = hf_apply(q, q, cos[:, t_k - t_q :], sin[:, t_k - t_q :])
    tol = dict(rtol=0, atol=0) if dtype == torch.float32 and offset < 64 else {}
    torch.testing.assert_close(got_q, want_q, **tol)
    torch.testing.assert_close(got_k, want_k, **tol)
    cot_q, cot_k = torch.randn_like(got_q), torch.randn_like(got_k)
    ours = torch.autograd.grad((got_q * cot_q).sum() + (got_k * cot_k).sum(), (q, k))
    theirs = torch.autograd.grad((want_q * cot_q).sum() + (want_k * cot_k).sum(), (q, k))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)


def test_rotate_half_is_hugging_faces() -> None:
    hf_rope(4)
    from transformers.models.llama.modeling_llama import rotate_half as hf_rotate_half

    x = torch.randn(3, 10)
    assert torch.equal(rotate_half(x), hf_rotate_half(x))


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 300), n=st.integers(0, 300), shift=st.integers(1, 500))
def test_rope_scores_depend_only_on_relative_position(m: int, n: int, shift: int) -> None:
    """<R_m q, R_n k> == <R_{m+s} q, R_{n+s} k>: the point of RoPE (Su et al. 2021, eq. 16)."""
    g = torch.Generator().manual_seed(m * 1000 + n)
    rope = RotaryEmbedding(16, context=1024)
    rope.double()
    q = torch.randn(1, 1, 1, 16, generator=g, dtype=F64)
    k = torch.randn(1, 1, 1, 16, generator=g, dtype=F64)

    def score(i: int, j: int) -> torch.Tensor:
        rq, _ = rope(q, q, i)
        _, rk = rope(k, k, j)
        return (rq * rk).sum()

    # The angles are computed in float32, as in HF (inv_freq and position * inv_freq), so each
    # carries an error of about position * 1.2e-7 rad; the score moves by at most |q||k| times
    # the sum of those errors.
    atol = float(q.norm() * k.norm()) * (1e-6 + 2.5e-7 * (m + n + 2 * shift))
    torch.testing.assert_close(score(m, n), score(m + shift, n + shift), rtol=0, atol=atol)


def test_rope_needs_even_head_dim() -> None:
    with pytest.raises(ValueError, match="even head_dim, got 7"):
        RotaryEmbedding(7)


# --------------------------------------------------------------------------- ALiBi


def paper_slopes(n: int) -> list[float]:
    """The slopes of the ALiBi paper's reference code (Press et al. 2022, fairseq)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


def test_alibi_slopes_for_8_heads_are_half_to_1_over_256() -> None:
    expected = torch.tensor([2.0**-i for i in range(1, 9)])
    assert torch.equal(alibi_slopes(8), expected)


@pytest.mark.parametrize("n_heads", [1, 2, 3, 5, 6, 8, 12, 16, 24, 30])
def test_alibi_slopes_match_paper_and_bloom(n_heads: int) -> None:
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    slopes = alibi_slopes(n_heads)
    assert slopes.shape == (n_heads,)
    torch.testing.assert_close(slopes, torch.tensor(paper_slopes(n_heads)), rtol=0, atol=0)
    torch.testing.assert_close(slopes, _get_alibi_slopes(n_heads, "cpu"), rtol=1e-6, atol=0)


def test_alibi_non_power_of_two_interleaves() -> None:
    # 6 heads: the slopes of 4 heads (1/4 ... 1/256), then every other slope of 8 heads (1/2, 1/8)
    six = alibi_slopes(6)
    torch.testing.assert_close(six[:4], torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]))
    torch.testing.assert_close(six[:4], alibi_slopes(4))
    torch.testing.assert_close(six[4:], alibi_slopes(8)[0::2][:2])
    torch.testing.assert_close(six[4:], torch.tensor([2.0**-1, 2.0**-3]))


@pytest.mark.parametrize("t_q, t_k", [(6, 6), (1, 9), (3, 8)])
def test_alibi_bias_gives_blooms_causal_attention(t_q: int, t_k: int) -> None:
    """-m|i - j| and BLOOM's m·j differ by a constant per query row under a causal mask."""
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    H = 6
    alibi = ALiBi(H).double()
    bias = alibi(t_q, t_k)
    assert bias.shape == (1, H, t_q, t_k)
    i = torch.arange(t_k - t_q, t_k)[:, None]
    j = torch.arange(t_k)[None, :]
    torch.testing.assert_close(bias[0], -alibi.slopes[:, None, None] * (i - j).abs())

    bloom = build_alibi_tensor(torch.ones(1, t_k), H, F64).view(1, H, 1, t_k)
    q, k, v = torch.randn(2, H, t_q, 8, dtype=F64), *torch.randn(2, 2, H, t_k, 8, dtype=F64)
    causal = torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q)
    want = F.scaled_dot_product_attention(
        q, k, v, attn_mask=bloom.expand(1, H, t_q, t_k).masked_fill(~causal, float("-inf"))
    )
    for backend in ("explicit", "fused"):
        got, _ = scaled_dot_product_attention(q, k, v, is_causal=True, bias=bias, backend=backend)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("bidirectional, buckets, distance", [(True, 32, 8), (False, 11, 5)])
def test_t5_bias_refuses_a_max_distance_inside_the_exact_range(bidirectional, buckets, distance):
    """At or below the exact range the log-spaced buckets divide by log(1) = 0 (HF crashes)."""
    from attnlab.layers.positions import T5RelativePositionBias

    with pytest.raises(ValueError, match="must exceed the exact range"):
        T5RelativePositionBias(2, buckets, distance, bidirectional=bidirectional)
    T5RelativePositionBias(2, buckets, distance + buckets, bidirectional=bidirectional)(3, 5)


# --------------------------------------------------------------------------- RoPE scaling


def _hf_scaled_inv_freq(kind: str, head_dim: int, base: float, factor: float) -> torch.Tensor:
    """Hugging Face's inverse frequencies: linear scaling, or dynamic NTK evaluated at a length
    where it equals static NTK-aware scaling by ``factor`` (HF factor 1, seq_len = s · max)."""
    transformers = pytest.importorskip("transformers")
    from transformers import modeling_rope_utils as ru

    max_len = 64
    params = {"rope_type": "linear" if kind == "linear" else "dynamic", "rope_theta": base}
    params["factor"] = factor if kind == "linear" else 1.0
    config = transformers.LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        max_position_embeddings=max_len,
        rope_parameters=params,
    )
    if kind == "linear":
        inv_freq, _ = ru._compute_linear_scaling_rope_parameters(config)
    else:
        inv_freq, _ = ru._compute_dynamic_ntk_parameters(config, seq_len=int(factor * max_len))
    return inv_freq.double()


@pytest.mark.parametrize("kind", ["linear", "ntk"])
@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_rope_scaling_matches_hugging_face(kind: str, factor: float) -> None:
    head_dim, base = 16, 10000.0
    rope = RotaryEmbedding(head_dim, base, context=128, scaling=kind, factor=factor)
    want = _hf_scaled_inv_freq(kind, head_dim, base, factor)  # (Dh/2,)
    angles = torch.arange(128, dtype=F64)[:, None] * want[None]  # (P, Dh/2)
    half = head_dim // 2
    torch.testing.assert_close(rope.cos[:, :half].double(), angles.cos(), atol=2e-5, rtol=0)
    torch.testing.assert_close(rope.sin[:, :half].double(), angles.sin(), atol=2e-5, rtol=0)


def test_rope_scaling_formulas() -> None:
    """PI: position m gets angle (m / s)·θ_i; NTK: θ_0 unchanged, the slowest θ slowed by s."""
    d, s = 8, 4.0
    plain = RotaryEmbedding(d, context=64)
    pi = RotaryEmbedding(d, context=64, scaling="linear", factor=s)
    torch.testing.assert_close(pi.cos[8], plain.cos[2])  # position 8 / 4 = 2
    ntk = RotaryEmbedding(d, context=64, scaling="ntk", factor=s)
    ratio = plain.inv_freq / ntk.inv_freq
    torch.testing.assert_close(ratio[0], torch.tensor(1.0))
    torch.testing.assert_close(ratio[-1], torch.tensor(s))
    with pytest.raises(ValueError, match="RoPE scaling must be one of none, linear, ntk"):
        RotaryEmbedding(d, scaling="yarn")  # type: ignore[arg-type]
