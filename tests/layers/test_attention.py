"""attnlab.layers.attention against PyTorch's own attention, which nobody here wrote.

* ``scaled_dot_product_attention`` (explicit and fused paths) == ``F.scaled_dot_product_attention``
  over random shapes, masks (padding, causal, both, random, fully masked rows), additive bias,
  GQA and Tq != Tk, forward and gradients in float64 (property-based, hypothesis);
  fully masked rows give zeros and finite gradients; dropout matches torch under one seed
  (fused) and has the right statistics (explicit).
* mask helpers and converters == what ``nn.MultiheadAttention`` does with PyTorch-sense masks;
  causal masks == ``torch.nn.attention.bias.causal_lower_right``.
* ``MultiHeadAttention`` == ``nn.MultiheadAttention(batch_first=True)`` with copied weights.
* ``KVCache`` decoding == full causal recomputation (GQA, RoPE, padding, growth, reorder).
* bad input raises a ValueError that says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.nn.attention.bias import causal_lower_right

from _device import DEVICE, rng_state, set_rng_state
from attnlab.layers.attention import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    combine_masks,
    explicit_attention,
    from_attn_mask,
    from_key_padding_mask,
    matmul_attention,
    padding_mask,
    padding_mask_from_ids,
    scaled_dot_product_attention,
    to_attn_mask,
    to_key_padding_mask,
)
from attnlab.layers.efficient import LinearAttention, LocalAttention
from attnlab.layers.positions import RotaryEmbedding
from attnlab.verify.copy_weights import assert_grads_match, copy_links, mha_links

pytestmark = pytest.mark.usefixtures("on_test_device")  # tests/_device.py: ATTNLAB_TEST_DEVICE

F64 = torch.float64
TIGHT = dict(rtol=1e-9, atol=1e-11)  # float64, same maths in a different order
SETTINGS = settings(max_examples=60, deadline=None)
# "triton" needs CUDA: tests/layers/test_flash_triton.py
CPU_BACKENDS = ("explicit", "fused", "matmul", "flash")


def randn(g: torch.Generator, *shape: int, grad: bool = True) -> Tensor:
    return torch.randn(*shape, generator=g, dtype=F64).requires_grad_(grad)


# --------------------------------------------------------------------------- SDPA vs torch


@dataclass
class Case:
    B: int
    H: int
    Hkv: int
    Tq: int
    Tk: int
    Dk: int
    Dv: int
    mask_kind: str
    use_bias: bool
    scale: float | None
    seed: int


MASK_KINDS = ["none", "padding", "causal", "padding+causal", "random", "empty_rows"]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    mask_kind = draw(st.sampled_from(MASK_KINDS))
    hkv = draw(st.sampled_from([1, 2]))
    tq = draw(st.integers(1, 6))
    tk = draw(st.integers(1, 7))
    if "causal" in mask_kind:
        tk = max(tk, tq)  # bottom-right causal needs Tk >= Tq
    return Case(
        B=draw(st.integers(1, 3)),
        H=hkv * draw(st.sampled_from([1, 2, 3])),
        Hkv=hkv,
        Tq=tq,
        Tk=tk,
        Dk=draw(st.integers(1, 8)),
        Dv=draw(st.integers(1, 8)),
        mask_kind=mask_kind,
        use_bias=draw(st.booleans()),
        scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0))),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def build_masks(c: Case, g: torch.Generator) -> tuple[Tensor | None, bool, Tensor]:
    """(mask for attnlab, is_causal for attnlab, full reference mask (B, H, Tq, Tk)).

    The reference mask is built from definitions, not from attnlab's helpers: padding from
    ``arange < length``, causal from PyTorch's ``causal_lower_right``.
    """
    full = torch.ones(c.B, c.H, c.Tq, c.Tk, dtype=torch.bool)
    ours: Tensor | None = None
    is_causal = False
    if "padding" in c.mask_kind:
        lengths = torch.randint(0, c.Tk + 1, (c.B,), generator=g)  # 0: every row is empty
        keep = torch.arange(c.Tk)[None, :] < lengths[:, None]  # (B, Tk)
        full = full & keep[:, None, None, :]
        ours = keep[:, None, None, :]
    if "causal" in c.mask_kind:
        is_causal = True
        full = full & causal_lower_right(c.Tq, c.Tk)._materialize()
    if c.mask_kind in ("random", "empty_rows"):
        # A random mask with random broadcast dimensions.
        shape = [
            c.B if torch.rand((), generator=g) < 0.5 else 1,
            c.H if torch.rand((), generator=g) < 0.5 else 1,
            c.Tq,
            c.Tk,
        ]
        ours = torch.rand(*shape, generator=g) < 0.7
        if c.mask_kind == "empty_rows":
            ours[..., torch.randint(0, c.Tq, (1,), generator=g), :] = False
        full = full & ours
    return ours, is_causal, full


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, full: Tensor, bias: Tensor | None, scale: float | None
) -> Tensor:
    """torch's SDPA; empty rows are unmasked here (the test ignores them) to keep torch finite."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    safe = full | ~full.any(dim=-1, keepdim=True)
    attn_mask: Tensor = safe if bias is None else bias.masked_fill(~safe, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)


@SETTINGS
@given(cases())
def test_sdpa_matches_torch_forward_and_gradients(c: Case) -> None:
    g = torch.Generator(DEVICE).manual_seed(c.seed)
    q = randn(g, c.B, c.H, c.Tq, c.Dk)
    k = randn(g, c.B, c.Hkv, c.Tk, c.Dk)
    v = randn(g, c.B, c.Hkv, c.Tk, c.Dv)
    bias = randn(g, 1, c.H, c.Tq, c.Tk) if c.use_bias else None
    mask, is_causal, full = build_masks(c, g)
    nonempty = full.any(dim=-1)  # (B, H, Tq)
    cotangent = torch.randn(c.B, c.H, c.Tq, c.Dv, generator=g, dtype=F64) * nonempty[..., None]
    leaves = [t for t in (q, k, v, bias) if t is not None]

    expected = reference_attention(q, k, v, full, bias, c.scale)
    expected_grads = torch.autograd.grad((expected * cotangent).sum(), leaves)

    results = {}
    for backend in CPU_BACKENDS:
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            is_causal=is_causal,
            bias=bias,
            scale=c.scale,
            backend=backend,
            need_weights=backend == "explicit",
        )
        grads = torch.autograd.grad((out * cotangent).sum(), leaves)
        results[backend] = out
        # Rows with something to attend to: the reference; empty rows: exact zeros.
        torch.testing.assert_close(out * nonempty[..., None], expected * nonempty[..., None])
        assert torch.equal(out[~nonempty], torch.zeros_like(out[~nonempty]))
        for got, want in zip(grads, expected_grads):
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got, want)
        assert torch.equal(grads[0][~nonempty], torch.zeros_like(grads[0][~nonempty]))
        if weights is not None:
            # weights: zero where blocked, rows sum to 1 (0 for empty rows), and out = weights·V.
            assert weights.shape == (c.B, c.H, c.Tq, c.Tk)
            assert torch.equal(weights[~full], torch.zeros_like(weights[~full]))
            torch.testing.assert_close(weights.sum(-1), nonempty.to(F64))
            v_rep = v.repeat_interleave(c.H // c.Hkv, dim=1)
            torch.testing.assert_close(weights @ v_rep, out, **TIGHT)
    for backend in CPU_BACKENDS:
        torch.testing.assert_close(results[backend], results["explicit"], **TIGHT)


def test_fully_masked_everything_gives_zeros_and_finite_gradients() -> None:
    q = torch.randn(2, 4, 3, 5, dtype=F64, requires_grad=True)
    k = torch.randn(2, 2, 6, 5, dtype=F64, requires_grad=True)
    v = torch.randn(2, 2, 6, 5, dtype=F64, requires_grad=True)
    bias = torch.randn(1, 4, 3, 6, dtype=F64, requires_grad=True)
    mask = torch.zeros(2, 1, 1, 6, dtype=torch.bool)
    for backend in CPU_BACKENDS:
        for b in (None, bias):
            out, _ = scaled_dot_product_attention(q, k, v, mask, bias=b, backend=backend)
            assert torch.equal(out, torch.zeros_like(out))
            leaves = [q, k, v] + ([b] if b is not None else [])
            for grad in torch.autograd.grad(out.square().sum() + out.sum(), leaves):
                assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fully_masked_rows_in_low_precision(dtype: torch.dtype) -> None:
    q = torch.randn(2, 2, 4, 8, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, 5, 8, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 2, 5, 8, dtype=dtype, requires_grad=True)
    mask = torch.rand(2, 1, 4, 5) < 0.6
    mask[:, :, 1] = False
    for backend in CPU_BACKENDS:
        out, _ = scaled_dot_product_attention(q, k, v, mask, backend=backend)
        assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        assert all(torch.isfinite(g).all() for g in grads)


def test_backend_explicit_is_the_explicit_path_and_need_weights_takes_it() -> None:
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=F64) for _ in range(3))
    fused, none = scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert none is None
    torch.manual_seed(0)
    a, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.5, backend="explicit")
    torch.manual_seed(0)
    b, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5, need_weights=True)
    assert w is not None
    torch.testing.assert_close(a, b, **TIGHT)  # same RNG draws: the same explicit path
    torch.manual_seed(0)
    c, _ = explicit_attention(q, k, v, dropout_p=0.5)
    torch.testing.assert_close(c, a, **TIGHT)
    for backend in CPU_BACKENDS:
        plain, _ = scaled_dot_product_attention(q, k, v, backend=backend)
        torch.testing.assert_close(plain, fused, **TIGHT)
    names = "explicit, fused, matmul, flash, triton"
    with pytest.raises(ValueError, match=f"backend must be one of {names}"):
        scaled_dot_product_attention(q, k, v, backend="fast")


def test_matmul_backend_takes_bf16_rows_up_to_its_limit_and_leaves_the_rest_to_fused(seed):
    """Under CPU bf16 autocast the matmul backend computes rows of up to MATMUL_MAX_KEYS keys in
    bfloat16, within bf16's rounding of float64's attention (padded keys ignored; seeds 0-99:
    at most 0.012 past a 2% relative error), and gives longer rows, and float32 calls, to the
    fused kernel."""
    from attnlab.layers.attention import MATMUL_MAX_KEYS

    g = torch.Generator().manual_seed(seed)
    for Tk in (20, 100, MATMUL_MAX_KEYS, MATMUL_MAX_KEYS + 1):
        q, k, v = (torch.randn(3, 4, Tk, 8, generator=g) for _ in range(3))
        lengths = torch.tensor([Tk, Tk // 2, 1])
        mask = (torch.arange(Tk) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Tk)
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            got, _ = scaled_dot_product_attention(q, k, v, mask, backend="matmul")
            fused, _ = scaled_dot_product_attention(q, k, v, mask)
        assert got.dtype == torch.bfloat16, seed
        if Tk > MATMUL_MAX_KEYS:
            assert torch.equal(got, fused), seed
        else:
            assert not torch.equal(got, fused), seed  # its own steps, not the kernel's
            torch.testing.assert_close(got.double(), want, atol=0.05, rtol=0.02)
        with torch.no_grad():
            got, _ = scaled_dot_product_attention(q, k, v, mask, backend="matmul")
            fused, _ = scaled_dot_product_attention(q, k, v, mask)
        assert torch.equal(got, fused), seed


def test_matmul_attention_zeroes_rows_with_no_key_and_matches_under_gqa_bias_and_causal():
    """matmul_attention's masked rows, grouped-query heads, additive bias and causal mask
    against the explicit steps in float64 (gradients too)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 6, 8, dtype=F64, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, 6, 8, dtype=F64, generator=g) for _ in range(2))
    bias = torch.randn(1, 4, 6, 6, dtype=F64, generator=g)
    mask = torch.rand(2, 1, 6, 6, generator=g) < 0.6
    mask[0, 0, 2] = False  # a query row with nothing to attend to
    want, _ = explicit_attention(q, k, v, mask, is_causal=True, bias=bias, scale=8**-0.5)
    got = matmul_attention(q, k, v, mask, True, bias, 8**-0.5)  # (2, 4, 6, 8)
    want_grad, got_grad = (torch.autograd.grad(o.square().sum(), q)[0] for o in (want, got))
    assert torch.equal(got[0, :, 2], torch.zeros_like(got[0, :, 2]))
    torch.testing.assert_close(got, want, **TIGHT)
    torch.testing.assert_close(got_grad, want_grad, **TIGHT)


# --------------------------------------------------------------------------- dropout


def test_fused_dropout_equals_torch_under_the_same_seed() -> None:
    q = torch.randn(2, 4, 5, 8, dtype=F64)
    k, v = torch.randn(2, 4, 7, 8, dtype=F64), torch.randn(2, 4, 7, 8, dtype=F64)
    mask = torch.rand(2, 1, 5, 7) < 0.8
    state = rng_state()
    ours, _ = scaled_dot_product_attention(q, k, v, mask, dropout_p=0.3, backend="fused")
    set_rng_state(state)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.3)
    torch.testing.assert_close(ours, theirs, **TIGHT)
    set_rng_state(state)
    no_drop, _ = scaled_dot_product_attention(q, k, v, mask, backend="fused")
    assert not torch.allclose(ours, no_drop)


def test_explicit_dropout_drops_at_rate_p_and_rescales() -> None:
    p = 0.25
    q = torch.randn(8, 4, 16, 8, dtype=F64)
    k, v = torch.randn(8, 4, 32, 8, dtype=F64), torch.randn(8, 4, 32, 8, dtype=F64)
    _, clean = scaled_dot_product_attention(q, k, v, need_weights=True)
    out, dropped = scaled_dot_product_attention(q, k, v, dropout_p=p, need_weights=True)
    assert clean is not None and dropped is not None
    kept = dropped != 0
    frac = 1 - kept.double().mean().item()
    n = kept.numel()  # 16384 entries: 6 standard deviations of a binomial rate
    assert abs(frac - p) < 6 * (p * (1 - p) / n) ** 0.5, frac
    torch.testing.assert_close(dropped[kept], clean[kept] / (1 - p), **TIGHT)
    torch.testing.assert_close(out, dropped @ v, **TIGHT)


@pytest.mark.parametrize("backend", ["explicit", "fused"])
def test_dropout_is_unbiased(backend: str) -> None:
    """Inverted dropout: the mean output over many draws is the output without dropout."""
    n, p = 4000, 0.3
    q1, k1, v1 = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    q, k, v = (t.to(F64).expand(n, -1, -1, -1) for t in (q1, k1, v1))
    expected, _ = scaled_dot_product_attention(q1.to(F64), k1.to(F64), v1.to(F64))
    out, _ = scaled_dot_product_attention(q, k, v, dropout_p=p, backend=backend)
    mean, std = out.mean(0, keepdim=True), out.std(0, keepdim=True)
    assert (std > 0).all()
    assert ((mean - expected).abs() <= 6 * std / n**0.5 + 1e-12).all()


def test_mha_dropout_only_in_training() -> None:
    mha = MultiHeadAttention(16, 4, dropout=0.5).double()
    x = torch.randn(2, 5, 16, dtype=F64)
    mha.eval()
    a, _ = mha(x)
    b, _ = mha(x)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    mha.dropout = 0.0
    c, _ = mha(x)
    torch.testing.assert_close(a, c, rtol=0, atol=0)
    mha.dropout = 0.5
    mha.train()
    d, _ = mha(x)
    assert not torch.allclose(a, d)


# --------------------------------------------------------------------------- mask helpers


def _torch_mha(d_model: int, n_heads: int, **kw) -> tuple[MultiHeadAttention, nn.Module]:
    theirs = nn.MultiheadAttention(d_model, n_heads, batch_first=True, dtype=F64, **kw)
    ours = MultiHeadAttention(
        d_model, n_heads, kdim=kw.get("kdim"), vdim=kw.get("vdim"), bias=kw.get("bias", True)
    ).double()
    copy_links(mha_links(ours, theirs))
    return ours, theirs


def test_padding_mask_from_lengths_matches_key_padding_mask() -> None:
    B, T, d = 4, 7, 12
    lengths = torch.randint(1, T + 1, (B,))
    lengths[0] = T
    mask = padding_mask(lengths)
    assert mask.shape == (B, 1, 1, T) and mask.dtype == torch.bool
    kpm = torch.stack([torch.tensor([j >= n for j in range(T)]) for n in lengths.tolist()])
    assert torch.equal(to_key_padding_mask(mask), kpm)
    assert torch.equal(from_key_padding_mask(kpm), mask)
    longer = padding_mask(lengths, max_len=T + 3)
    assert longer.shape == (B, 1, 1, T + 3) and not longer[..., T:].any()

    ours, theirs = _torch_mha(d, 3)
    x = torch.randn(B, T, d, dtype=F64)
    want, _ = theirs(x, x, x, key_padding_mask=kpm, need_weights=False)
    got, _ = ours(x, mask=mask)
    torch.testing.assert_close(got, want)


def test_padding_mask_from_ids() -> None:
    pad = 3
    ids = torch.randint(0, 10, (3, 6))
    ids[ids == pad] = 4
    ids[0, 4:] = pad
    ids[2, 1] = pad  # padding in the middle is still padding
    mask = padding_mask_from_ids(ids, pad_id=pad)
    assert mask.shape == (3, 1, 1, 6)
    assert torch.equal(to_key_padding_mask(mask), ids == pad)
    assert torch.equal(padding_mask_from_ids(ids), (ids != 0)[:, None, None, :])

    ours, theirs = _torch_mha(8, 2)
    x = torch.randn(3, 6, 8, dtype=F64)
    want, _ = theirs(x, x, x, key_padding_mask=ids == pad, need_weights=False)
    got, _ = ours(x, mask=mask)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("t_q, t_k", [(1, 1), (4, 4), (1, 5), (3, 7), (6, 9)])
def test_causal_mask_is_bottom_right_aligned(t_q: int, t_k: int) -> None:
    mask = causal_mask(t_q, t_k)
    assert mask.shape == (1, 1, t_q, t_k)
    assert torch.equal(mask[0, 0], causal_lower_right(t_q, t_k)._materialize())
    if t_q == t_k:  # the usual square mask == nn.Transformer's, converted from PyTorch's sense
        square = nn.Transformer.generate_square_subsequent_mask(t_q, dtype=F64)
        assert torch.equal(from_attn_mask(square), mask)
    # and attention with it == torch's attention with the lower-right causal bias
    q = torch.randn(2, 2, t_q, 4, dtype=F64)
    k, v = torch.randn(2, 2, t_k, 4, dtype=F64), torch.randn(2, 2, t_k, 4, dtype=F64)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(t_q, t_k))
    for backend in CPU_BACKENDS:
        got, _ = scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("h, hkv", [(4, 4), (4, 2), (6, 1)])
def test_causal_without_mask_uses_the_kernels_causal_flag_correctly(h: int, hkv: int) -> None:
    """Tq == Tk, no mask, no bias: the fused path hands is_causal to torch's kernel."""
    q = torch.randn(2, h, 9, 8, dtype=F64, requires_grad=True)
    k = torch.randn(2, hkv, 9, 8, dtype=F64, requires_grad=True)
    v = torch.randn(2, hkv, 9, 8, dtype=F64, requires_grad=True)
    want, _ = scaled_dot_product_attention(q, k, v, causal_mask(9), backend="explicit")
    got, _ = scaled_dot_product_attention(q, k, v, is_causal=True, backend="fused")
    torch.testing.assert_close(got, want, **TIGHT)
    cot = torch.randn_like(want)
    for a, b in zip(
        torch.autograd.grad((got * cot).sum(), (q, k, v)),
        torch.autograd.grad((want * cot).sum(), (q, k, v)),
    ):
        torch.testing.assert_close(a, b, **TIGHT)


def test_combine_masks() -> None:
    a = torch.rand(2, 1, 1, 5) < 0.5
    b = torch.rand(1, 1, 3, 5) < 0.5
    c = torch.rand(2, 4, 3, 5) < 0.5
    assert combine_masks() is None and combine_masks(None, None) is None
    assert combine_masks(None, a) is a
    assert torch.equal(combine_masks(a, None, b), a & b)
    assert torch.equal(combine_masks(a, b, c), a & b & c)
    assert combine_masks(a, b).shape == (2, 1, 3, 5)


def _rows_not_empty(attn_block: Tensor, kpm: Tensor) -> None:
    """Open one key per query row that padding does not hide (torch gives NaN on empty rows)."""
    t_q = attn_block.shape[-2]
    first_real = 0  # right padding with lengths >= 1: key 0 is always real
    assert not kpm[:, first_real].any()
    attn_block[..., torch.arange(t_q), first_real] = False


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_from_attn_mask_matches_torch_mha(dims: int, kind: str) -> None:
    B, T, d, H = 3, 5, 8, 2
    kpm = torch.arange(T)[None, :] >= torch.randint(1, T + 1, (B,))[:, None]  # True = ignore
    blocked = torch.rand(*(B * H,) * (dims == 3), T, T) < 0.4  # PyTorch sense: True = blocked
    _rows_not_empty(blocked, kpm)
    attn_mask, key_padding = blocked, kpm
    if kind == "float":  # torch wants both masks of one type
        attn_mask = torch.zeros(blocked.shape, dtype=F64).masked_fill(blocked, float("-inf"))
        key_padding = torch.zeros(kpm.shape, dtype=F64).masked_fill(kpm, float("-inf"))
    ours_mask = from_attn_mask(attn_mask, n_heads=H)
    assert ours_mask.shape == ((1, 1, T, T) if dims == 2 else (B, H, T, T))
    assert torch.equal(to_attn_mask(ours_mask), blocked.view(ours_mask.shape))

    ours, theirs = _torch_mha(d, H)
    x = torch.randn(B, T, d, dtype=F64)
    want, want_w = theirs(
        x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding, average_attn_weights=False
    )
    combined = combine_masks(ours_mask, from_key_padding_mask(key_padding))
    got, got_w = ours(x, mask=combined, need_weights=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_w, want_w)
    fused, _ = ours(x, mask=combined)
    torch.testing.assert_close(fused, want)


def test_key_padding_mask_round_trips() -> None:
    kpm = torch.rand(4, 6) < 0.3
    mask = from_key_padding_mask(kpm)
    assert mask.shape == (4, 1, 1, 6)
    assert torch.equal(to_key_padding_mask(mask), kpm)
    additive = torch.zeros(4, 6).masked_fill(kpm, float("-inf"))
    assert torch.equal(from_key_padding_mask(additive), mask)
    assert torch.equal(from_key_padding_mask(to_key_padding_mask(mask)), mask)
    square = torch.rand(1, 1, 3, 3) < 0.5
    assert torch.equal(from_attn_mask(to_attn_mask(square)[0, 0]), square)


# --------------------------------------------------------------------------- MHA vs torch


def _random_masks(
    B: int, H: int, t_q: int, t_k: int
) -> list[tuple[str, Tensor | None, Tensor | None]]:
    """(name, key_padding_mask, attn_mask) in PyTorch's sense, every query row non-empty."""
    kpm = torch.arange(t_k)[None, :] >= torch.randint(1, t_k + 1, (B,))[:, None]
    blocked2 = torch.rand(t_q, t_k) < 0.4
    blocked3 = torch.rand(B * H, t_q, t_k) < 0.4
    for m in (blocked2, blocked3):
        _rows_not_empty(m, kpm)
    float2 = torch.zeros(t_q, t_k, dtype=F64).masked_fill(blocked2, float("-inf"))
    return [
        ("none", None, None),
        ("key_padding", kpm, None),
        ("attn_bool_2d", None, blocked2),
        ("attn_float_2d", None, float2),
        ("attn_bool_3d", None, blocked3),
        ("both", kpm, blocked3),
    ]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", ["self", "cross", "cross_kdim"])
def test_mha_matches_torch_multihead_attention(kind: str, bias: bool) -> None:
    B, t_q = torch.randint(1, 4, ()).item(), torch.randint(1, 7, ()).item()
    H, head = [1, 2, 4][torch.randint(0, 3, ()).item()], torch.randint(1, 5, ()).item()
    d = H * head
    t_k = t_q if kind == "self" else torch.randint(1, 7, ()).item()
    kdim = torch.randint(2, 10, ()).item() if kind == "cross_kdim" else None
    if kdim == d:
        kdim += 1
    ours, theirs = _torch_mha(d, H, bias=bias, kdim=kdim, vdim=kdim)
    links = mha_links(ours, theirs)

    for name, kpm, attn_mask in _random_masks(B, H, t_q, t_k):
        mask = combine_masks(
            None if kpm is None else from_key_padding_mask(kpm),
            None if attn_mask is None else from_attn_mask(attn_mask, n_heads=H),
        )
        for need_weights, average in [(False, False), (True, True), (True, False)]:
            x = torch.randn(B, t_q, d, dtype=F64, requires_grad=True)
            ctx = (
                None
                if kind == "self"
                else torch.randn(B, t_k, kdim or d, dtype=F64, requires_grad=True)
            )
            src = x if ctx is None else ctx
            want, want_w = theirs(
                x,
                src,
                src,
                key_padding_mask=kpm,
                attn_mask=attn_mask,
                need_weights=need_weights,
                average_attn_weights=average,
            )
            for p in (*ours.parameters(), *theirs.parameters()):
                p.grad = None
            got, got_w = ours(x, ctx, mask=mask, need_weights=need_weights, average_weights=average)
            msg = f"{kind} bias={bias} mask={name} weights={need_weights}/{average}"
            torch.testing.assert_close(got, want, msg=msg)
            if need_weights:
                torch.testing.assert_close(got_w, want_w, msg=msg)
            else:
                assert got_w is None
            cot = torch.randn_like(want)
            inputs = [x] if ctx is None else [x, ctx]
            g_ours = torch.autograd.grad((got * cot).sum(), inputs, retain_graph=True)
            g_theirs = torch.autograd.grad((want * cot).sum(), inputs, retain_graph=True)
            for a, b in zip(g_ours, g_theirs):
                torch.testing.assert_close(a, b, msg=msg)
            (got * cot).sum().backward()
            (want * cot).sum().backward()
            assert_grads_match(links)


def test_mha_gqa_equals_mha_with_repeated_kv_heads() -> None:
    """GQA == full MHA whose key/value heads are copies (each serving n_heads/n_kv_heads)."""
    d, H, Hkv, hd = 24, 6, 2, 4
    gqa = MultiHeadAttention(d, H, Hkv).double()
    full = MultiHeadAttention(d, H).double()
    k_w, v_w = gqa.kv_proj.weight.chunk(2)
    k_b, v_b = gqa.kv_proj.bias.chunk(2)

    def rep(t: Tensor) -> Tensor:
        return t.view(Hkv, hd, *t.shape[1:]).repeat_interleave(H // Hkv, 0).flatten(0, 1)

    with torch.no_grad():
        full.q_proj.load_state_dict(gqa.q_proj.state_dict())
        full.kv_proj.weight.copy_(torch.cat([rep(k_w), rep(v_w)]))
        full.kv_proj.bias.copy_(torch.cat([rep(k_b), rep(v_b)]))
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = torch.randn(2, 5, d, dtype=F64)
    mask = torch.rand(2, 1, 5, 5) < 0.7
    for need_weights in (False, True):
        a, wa = gqa(x, mask=mask, is_causal=True, need_weights=need_weights)
        b, wb = full(x, mask=mask, is_causal=True, need_weights=need_weights)
        torch.testing.assert_close(a, b, **TIGHT)
        if need_weights:
            torch.testing.assert_close(wa, wb, **TIGHT)


# --------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("left_pad", [False, True])
def test_kv_cache_decoding_equals_full_recomputation(
    n_kv_heads: int | None, rope: bool, left_pad: bool
) -> None:
    d, H, B, T, prompt = 16, 4, 3, 37, 3  # 37 > initial capacity 16: the cache grows twice
    rotary = RotaryEmbedding(d // H, context=8) if rope else None  # context 8: RoPE extends too
    mha = MultiHeadAttention(d, H, n_kv_heads, rotary=rotary).double().eval()
    x = torch.randn(B, T, d, dtype=F64)
    mask = None
    if left_pad:
        pads = torch.randint(0, 4, (B,))
        mask = (torch.arange(T)[None, :] >= pads[:, None])[:, None, None, :]  # (B, 1, 1, T)
    full, _ = mha(x, mask=mask, is_causal=True)

    cache = KVCache()
    steps = [(0, prompt)] + [(t, t + 1) for t in range(prompt, 20)] + [(20, 23)]  # 1 chunk of 3
    steps += [(t, t + 1) for t in range(23, T)]
    outs = []
    for start, end in steps:
        m = None if mask is None else mask[..., :end]
        out, _ = mha(x[:, start:end], mask=m, is_causal=True, cache=cache)
        outs.append(out)
        assert cache.length == end
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TIGHT)
    assert cache.keys.shape == (B, n_kv_heads or H, T, d // H)


def test_kv_cache_append_grows_and_keeps_contents() -> None:
    cache = KVCache()
    ks, vs = [], []
    for n in [3, 1, 1, 14, 1, 20, 2, 40]:  # crosses the initial capacity several times
        k, v = torch.randn(2, 3, n, 4), torch.randn(2, 3, n, 5)
        keys, values = cache.append(k, v)
        ks.append(k)
        vs.append(v)
        assert torch.equal(keys, torch.cat(ks, dim=2))
        assert torch.equal(values, torch.cat(vs, dim=2))
    assert cache.length == 82 and not cache.static


def test_kv_cache_reorder_selects_rows() -> None:
    d, H, B, T = 12, 3, 4, 6
    mha = MultiHeadAttention(d, H).double().eval()
    x = torch.randn(B, T + 1, d, dtype=F64)
    cache = KVCache()
    mha(x[:, :T], is_causal=True, cache=cache)
    keys_before = cache.keys.clone()
    index = torch.tensor([2, 0, 0, 3])
    cache.reorder(index)
    assert torch.equal(cache.keys, keys_before[index])
    # decoding on after the reorder == full recomputation on the reordered batch
    x2 = x[index]
    x2[:, T] = torch.randn(B, d, dtype=F64)
    step, _ = mha(x2[:, T:], is_causal=True, cache=cache)
    full, _ = mha(x2, is_causal=True)
    torch.testing.assert_close(step, full[:, T:], **TIGHT)


def test_cross_attention_cache_is_static_and_equals_recomputation() -> None:
    d, H, B, Tk = 16, 4, 2, 9
    for kdim in (None, 10):
        mha = MultiHeadAttention(d, H, 2, kdim=kdim, vdim=kdim).double().eval()
        ctx = torch.randn(B, Tk, kdim or d, dtype=F64)
        mem_mask = (torch.rand(B, 1, 1, Tk) < 0.8) | (torch.arange(Tk) == 0)
        cache = KVCache()
        for _ in range(4):
            x = torch.randn(B, 1, d, dtype=F64)
            got, _ = mha(x, ctx, mask=mem_mask, cache=cache)
            want, _ = mha(x, ctx, mask=mem_mask)
            torch.testing.assert_close(got, want, **TIGHT)
            assert cache.static and cache.length == Tk
        # after the first call the context is not read again
        got, _ = mha(x, torch.zeros_like(ctx), mask=mem_mask, cache=cache)
        torch.testing.assert_close(got, want, **TIGHT)


# --------------------------------------------------------------------------- bad input


def _raises(fn, *fragments: str) -> None:
    with pytest.raises(ValueError) as info:
        fn()
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"


def test_errors_name_what_to_change() -> None:
    q = torch.randn(2, 4, 3, 8)
    k = v = torch.randn(2, 4, 5, 8)
    _raises(
        lambda: MultiHeadAttention(10, 3),
        "d_model=10 is not divisible by n_heads=3",
        "choose n_heads from [1, 2, 5, 10]",
        "head_dim",
    )
    _raises(
        lambda: MultiHeadAttention(16, 4, n_kv_heads=3),
        "n_heads=4 must be a multiple of n_kv_heads=3",
    )
    _raises(lambda: MultiHeadAttention(16, 4, dropout=1.0), "dropout must be in [0, 1)")
    _raises(
        lambda: scaled_dot_product_attention(q, k, v, torch.ones(2, 1, 1, 4, dtype=torch.bool)),
        "mask of shape (2, 1, 1, 4) does not broadcast to (B, H, Tq, Tk) = (2, 4, 3, 5)",
        "key padding mask is (B, 1, 1, Tk)",
    )
    _raises(
        lambda: scaled_dot_product_attention(q, k, v, torch.zeros(1, 1, 3, 5)),
        "mask must be a bool tensor (True = may attend), got torch.float32",
        "from_attn_mask",
        "bias=",
    )
    _raises(
        lambda: from_attn_mask(torch.full((3, 3), 0.5)),
        "attn_mask holds values other than 0 and -inf",
        "pass it as bias= instead",
    )
    _raises(
        lambda: from_key_padding_mask(torch.full((2, 3), -1e9)),
        "key_padding_mask holds values other than 0 and -inf",
    )
    _raises(lambda: from_attn_mask(torch.zeros(8, 3, 3, dtype=torch.bool)), "needs n_heads")
    _raises(
        lambda: from_attn_mask(torch.zeros(6, 3, 3, dtype=torch.bool), n_heads=4),
        "first dimension 6 is not a multiple of n_heads=4",
    )
    _raises(
        lambda: MultiHeadAttention(16, 4, kdim=8, vdim=12),
        "kdim=8 and vdim=12 differ",
        "set vdim equal to kdim",
    )
    _raises(lambda: from_attn_mask(torch.zeros(2, 2, 3, 3, dtype=torch.bool)), "2-D or 3-D")
    _raises(lambda: from_key_padding_mask(torch.zeros(2, 1, 3, dtype=torch.bool)), "(B, Tk)")
    _raises(lambda: causal_mask(5, 3), "needs Tk >= Tq, got Tq=5, Tk=3")
    _raises(
        lambda: scaled_dot_product_attention(q, k[:, :, :2], v[:, :, :2], is_causal=True),
        "Tk >= Tq",
    )
    _raises(lambda: scaled_dot_product_attention(q[0], k, v), "same number of dimensions")
    _raises(
        lambda: scaled_dot_product_attention(q, k[:, :3], v[:, :3]),
        "query heads (4) must be a multiple of key/value heads (k: 3, v: 3)",
    )
    _raises(lambda: padding_mask(torch.ones(2, 3)), "lengths must be 1-D (B,)")
    _raises(lambda: padding_mask_from_ids(torch.ones(3, dtype=torch.long)), "ids must be (B, T)")
    _raises(lambda: to_key_padding_mask(torch.ones(2, 3, dtype=torch.bool)), "(B, 1, 1, Tk)")

    mha = MultiHeadAttention(16, 4)
    _raises(
        lambda: mha(torch.randint(0, 5, (2, 3, 16))),
        "x must be a floating tensor of shape (B, T, 16), got dtype torch.int64",
        "embedding layer",
    )
    _raises(lambda: mha(torch.randn(2, 3, 8)), "x must have shape (B, T, 16), got (2, 3, 8)")
    _raises(lambda: mha(torch.randn(3, 16)), "x must have shape (B, T, 16), got (3, 16)")
    _raises(
        lambda: mha(torch.randn(2, 3, 16), torch.randn(2, 4, 12)),
        "context must have shape (B, T, 16), got (2, 4, 12)",
    )
    _raises(
        lambda: mha(torch.randn(2, 3, 16), mask=torch.ones(2, 3, dtype=torch.bool)),
        "does not broadcast",
    )


# --------------------------------------------------------------------------- mask ranks


def _per_sample_masks(B: int, T: int) -> Tensor:
    """(B, T, T): sample 0 causal, the others random with key 0 always open (no empty rows)."""
    mask = torch.rand(B, T, T) < 0.6
    mask[:, :, 0] = True
    mask[0] = torch.ones(T, T, dtype=torch.bool).tril()
    return mask


@pytest.mark.parametrize("need_weights", [False, True])
def test_3d_mask_is_per_sample_even_when_batch_equals_heads(need_weights: bool) -> None:
    """B == H == 2 (equal, so a mask wrongly read per head would still fit), sample 0 causal,
    sample 1 full. A (B, Tq, Tk) mask is per sample: nn.MultiheadAttention given the same mask
    repeated per head, (B*H, Tq, Tk)."""
    B, T, d, H = 2, 4, 8, 2
    ours, theirs = _torch_mha(d, H)
    x = torch.randn(B, T, d, dtype=F64)
    mask = torch.ones(B, T, T, dtype=torch.bool)
    mask[0] = torch.ones(T, T, dtype=torch.bool).tril()
    blocked = (~mask).repeat_interleave(H, dim=0)  # (B*H, Tq, Tk), PyTorch sense
    want, want_w = theirs(x, x, x, attn_mask=blocked, average_attn_weights=False)
    got, got_w = ours(x, mask=mask, need_weights=need_weights)
    torch.testing.assert_close(got, want)
    if need_weights:
        torch.testing.assert_close(got_w, want_w)
        future = ~torch.ones(T, T, dtype=torch.bool).tril()
        assert torch.equal(got_w[0][:, future], torch.zeros(H, int(future.sum()), dtype=F64))


@pytest.mark.parametrize("B, H", [(2, 2), (3, 1), (1, 4), (3, 6)])
def test_every_mask_rank_equals_torch_with_the_mask_expanded(B: int, H: int) -> None:
    """2-D shared, 3-D per sample, 4-D per sample and head: each == F.sdpa given the mask
    expanded by hand to (B, H, Tq, Tk), on the fused and explicit paths and through MHA."""
    T, dh = 5, 3
    q, k, v = (torch.randn(B, H, T, dh, dtype=F64) for _ in range(3))
    per_sample = _per_sample_masks(B, T)
    shared = per_sample[0]
    per_head = torch.rand(B, H, T, T) < 0.6
    per_head[..., 0] = True
    cases = {
        "2-D (Tq, Tk)": (shared, shared.expand(B, H, T, T)),
        "3-D (B, Tq, Tk)": (per_sample, per_sample[:, None].expand(B, H, T, T)),
        "3-D (1, Tq, Tk)": (shared[None], shared.expand(B, H, T, T)),
        "3-D key padding (B, 1, Tk)": (per_sample[:, -1:], per_sample[:, None, -1:]),
        "4-D (B, H, Tq, Tk)": (per_head, per_head),
        "4-D (1, H, Tq, Tk)": (per_head[:1], per_head[:1].expand(B, H, T, T)),
    }
    mha, theirs = _torch_mha(H * dh, H)
    x = torch.randn(B, T, H * dh, dtype=F64)
    for name, (mask, full) in cases.items():
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=full.contiguous())
        for backend in CPU_BACKENDS:
            got, _ = scaled_dot_product_attention(q, k, v, mask, backend=backend)
            torch.testing.assert_close(got, want, **TIGHT, msg=f"{name} backend={backend}")
        blocked = (~full.expand(B, H, T, T)).reshape(B * H, T, T)
        want_mha, _ = theirs(x, x, x, attn_mask=blocked, need_weights=False)
        for need_weights in (False, True):
            got_mha, _ = mha(x, mask=mask, need_weights=need_weights)
            torch.testing.assert_close(got_mha, want_mha, msg=name)


@pytest.mark.parametrize("kernel", ["local", "linear"])
def test_efficient_kernels_read_a_3d_mask_per_sample(kernel: str) -> None:
    """Local attention with a window covering everything == full attention with the mask
    expanded by hand; linear attention takes a 3-D key padding mask (B, 1, Tk) per sample."""
    B, H, T, dh = 2, 2, 6, 4
    q, k, v = (torch.randn(B, H, T, dh, dtype=F64) for _ in range(3))
    if kernel == "local":
        mask = _per_sample_masks(B, T)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None].expand(B, H, T, T))
        for need_weights in (False, True):
            got, _ = LocalAttention(window=T)(q, k, v, mask=mask, need_weights=need_weights)
            torch.testing.assert_close(got, want, **TIGHT)
        return
    lengths = torch.tensor([T, 3])
    mask = (torch.arange(T)[None, :] < lengths[:, None])[:, None, :]  # (B, 1, Tk)
    got, _ = LinearAttention()(q, k, v, mask=mask)
    for b in range(B):  # oracle: each sample alone with its padding keys cut off
        n = int(lengths[b])
        alone, _ = LinearAttention()(q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n])
        torch.testing.assert_close(got[b : b + 1], alone, **TIGHT)


def _refused(call, mask: Tensor, *fragments: str) -> None:
    _raises(lambda: call(mask), *fragments)


def test_masks_that_do_not_fit_the_rule_are_refused_with_how_to_reshape() -> None:
    B, H, T = 2, 3, 4
    q = k = v = torch.randn(B, H, T, 5)
    mha = MultiHeadAttention(H * 5, H)
    x = torch.randn(B, T, H * 5)
    per_head_3d = torch.ones(H, T, T, dtype=torch.bool)  # (H, Tq, Tk): a per-head mask
    for call in (
        lambda m: scaled_dot_product_attention(q, k, v, m),
        lambda m: mha(x, mask=m),
        lambda m: LocalAttention(window=2)(q, k, v, mask=m),
    ):
        _refused(
            call,
            per_head_3d,
            "3-D mask is one per sample (B, Tq, Tk)",
            "first dimension 3 is not the batch size 2",
            "(1, H, Tq, Tk), i.e. mask[None]",
        )
        _refused(call, torch.ones(T, dtype=torch.bool), "has 1 dimensions", "reshape it")
        _refused(
            call,
            torch.ones(1, B, H, T, T, dtype=torch.bool),
            "has 5 dimensions",
            "2-D (Tq, Tk), 3-D (B, Tq, Tk) or 4-D (B, H, Tq, Tk)",
        )
        _refused(
            call,
            torch.ones(B, T, T + 1, dtype=torch.bool),
            "does not broadcast to (B, Tq, Tk) = (2, 4, 4)",
        )
    _raises(
        lambda: scaled_dot_product_attention(q, k, v, bias=torch.zeros(H, T, T)),
        "3-D bias is one per sample",
        "bias[None]",
    )


# --------------------------------------------------------------------------- leading dims


def _weights_oracle(q: Tensor, k: Tensor, full: Tensor | None, gqa: bool) -> Tensor:
    """Attention weights from torch alone: F.sdpa with V = identity returns softmax(QKᵀ)."""
    Tk = k.shape[-2]
    eye = torch.eye(Tk, dtype=q.dtype).expand(*k.shape[:-1], Tk)  # (…, Tk, Tk)
    return F.scaled_dot_product_attention(q, k, eye, attn_mask=full, enable_gqa=gqa)


@pytest.mark.parametrize(
    "shape_q, shape_kv, mask_shape",
    [
        ((3, 5, 4), (3, 6, 4), None),  # (B, T, D): one head
        ((3, 5, 4), (3, 6, 4), (3, 5, 6)),  # per-sample mask
        ((3, 5, 4), (3, 6, 4), (5, 6)),  # shared mask
        ((3, 5, 4), (3, 6, 4), (3, 1, 6)),  # key padding
        ((2, 4, 5, 3), (2, 2, 6, 3), (2, 5, 6)),  # 4-D, GQA, per-sample mask
        ((2, 3, 4, 5, 3), (2, 3, 4, 6, 3), None),  # 5-D
        ((2, 3, 4, 5, 3), (2, 3, 2, 6, 3), (2, 1, 4, 5, 6)),  # 5-D, GQA, full-rank mask
        ((2, 3, 4, 5, 3), (2, 3, 4, 6, 3), (1, 3, 1, 1, 6)),  # 5-D, broadcast dims
        ((2, 3, 4, 5, 3), (2, 3, 4, 6, 3), (2, 5, 6)),  # 5-D, per-sample mask
        ((5, 3), (6, 3), (5, 6)),  # no leading dimensions at all
    ],
)
def test_sdpa_accepts_any_leading_dimensions(
    shape_q: tuple[int, ...], shape_kv: tuple[int, ...], mask_shape: tuple[int, ...] | None
) -> None:
    """(…, T, D) inputs == F.scaled_dot_product_attention (outputs, weights, gradients)."""
    n = len(shape_q)
    q = torch.randn(*shape_q, dtype=F64, requires_grad=True)
    k = torch.randn(*shape_kv, dtype=F64, requires_grad=True)
    v = torch.randn(*shape_kv[:-1], 2, dtype=F64, requires_grad=True)
    gqa = n >= 4 and shape_q[-3] != shape_kv[-3]
    mask = full = None
    if mask_shape is not None:
        mask = torch.rand(mask_shape) < 0.6
        mask[..., 0, :] = False  # an empty row: zeros, as torch gives
        # the reference reads the mask by hand: a 3-D mask of a deeper input is per sample
        full = (
            mask
            if len(mask_shape) in (2, n)
            else mask.view(mask_shape[0], *(1,) * (n - 3), *mask_shape[1:])
        )
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=full, enable_gqa=gqa)
    want_w = _weights_oracle(q, k, full, gqa)
    cot = torch.randn_like(want)
    want_g = torch.autograd.grad((want * cot).sum(), (q, k, v))
    for backend in CPU_BACKENDS:
        explicit = backend == "explicit"
        out, w = scaled_dot_product_attention(q, k, v, mask, backend=backend, need_weights=explicit)
        assert out.shape == want.shape
        torch.testing.assert_close(out, want, **TIGHT)
        for got, expected in zip(torch.autograd.grad((out * cot).sum(), (q, k, v)), want_g):
            torch.testing.assert_close(got, expected, **TIGHT)
        if explicit:
            assert w is not None and w.shape == want_w.shape
            torch.testing.assert_close(w, want_w, **TIGHT)


# --------------------------------------------------------------------------- empty rows in MHA


@pytest.mark.parametrize("kernel", [None, "local"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_mha_row_with_nothing_to_attend_to_is_out_proj_bias(
    kernel: str | None, need_weights: bool
) -> None:
    """Attention gives zeros for such a row, then out_proj applies: the row is out_proj.bias
    exactly, no NaN, and the whole output equals nn.MultiheadAttention's fused path."""
    B, T, d, H = 2, 5, 8, 2
    ours, theirs = _torch_mha(d, H)
    with torch.no_grad():  # nn.MultiheadAttention starts with zero biases: make them visible
        theirs.in_proj_bias.normal_()
        theirs.out_proj.bias.normal_()
    copy_links(mha_links(ours, theirs))
    if kernel == "local":
        ours.kernel = LocalAttention(window=T)
    x = torch.randn(B, T, d, dtype=F64, requires_grad=True)
    mask = _per_sample_masks(B, T)
    mask[1, 2] = False  # sample 1, query 2: nothing to attend to
    got, _ = ours(x, mask=mask[:, None], need_weights=need_weights)  # (B, 1, Tq, Tk)
    blocked = (~mask).repeat_interleave(H, dim=0)  # (B*H, Tq, Tk), PyTorch sense
    want, _ = theirs(x, x, x, attn_mask=blocked, need_weights=False)
    assert torch.isfinite(got).all()
    assert torch.equal(got[1, 2], ours.out_proj.bias)
    torch.testing.assert_close(got, want)
    grad = torch.autograd.grad(got.square().sum(), x)[0]
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("masked", [False, True])
def test_cpu_low_precision_attention_that_trains_runs_in_float32(
    dtype: torch.dtype, masked: bool
) -> None:
    """A CPU call in bf16/fp16 whose backward pass will run attends in float32 (torch's CPU
    kernel is ~4x slower backwards in the low precision): output and gradients are torch's
    float32 kernel on the same rounded inputs, rounded back, also under autocast (which must
    not cast the float32 call back down). Without gradients the low-precision kernel runs."""
    B, H, T, D = 2, 3, 9, 8
    q, k, v = (torch.randn(B, H, T, D).to(dtype).requires_grad_() for _ in range(3))
    mask = padding_mask(torch.tensor([T, 4]), T) if masked else None
    g = torch.randn(B, H, T, D).to(dtype)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=mask)
    want.backward(g.float())
    for ctx in (torch.autocast("cpu", enabled=False), torch.autocast("cpu", dtype=dtype)):
        with ctx:
            out, _ = scaled_dot_product_attention(q, k, v, mask)
        assert out.dtype == dtype
        assert torch.equal(out, want.to(dtype))
        grads = torch.autograd.grad(out, (q, k, v), g)
        for got, ref in zip(grads, (q32.grad, k32.grad, v32.grad), strict=True):
            assert torch.equal(got, ref.to(dtype))
    with torch.no_grad():
        plain, _ = scaled_dot_product_attention(q, k, v, mask)
        low = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(plain, low)
