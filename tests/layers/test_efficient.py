"""Local (sliding-window) and linear attention against independent float64 oracles.

Oracles: ``F.scaled_dot_product_attention`` with a band mask built here by a double loop
(local), and a direct per-query evaluation of Katharopoulos et al. (2020) eq. 2 with
sim(q, k) = φ(q)ᵀφ(k) (linear). Decoding caches are checked against full recomputation.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.configs import apply_overrides, from_dict
from attnlab.layers.attention import MultiHeadAttention, padding_mask, scaled_dot_product_attention
from attnlab.layers.efficient import (
    LinearAttention,
    LinearAttentionState,
    LocalAttention,
    SlidingWindowCache,
    check_attention_config,
    linear_attention_causal,
    make_kernel,
)
from attnlab.models.classifier import ClassifierConfig, TextClassifier
from attnlab.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("on_test_device")  # tests/_device.py: ATTNLAB_TEST_DEVICE

F64 = torch.float64


def qkv(B=2, H=3, T=13, D=8, Hkv=None, grad=True):
    Hkv = H if Hkv is None else Hkv
    q = torch.randn(B, H, T, D, dtype=F64, requires_grad=grad)
    k = torch.randn(B, Hkv, T, D, dtype=F64, requires_grad=grad)
    v = torch.randn(B, Hkv, T, D, dtype=F64, requires_grad=grad)
    return q, k, v


def loop_band(T: int, window: int, causal: bool, n_global: int) -> torch.Tensor:
    """(T, T) True = may attend, one entry at a time (independent of attnlab's band_mask)."""
    m = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        for j in range(T):
            if causal and j > i:
                continue
            m[i, j] = abs(i - j) < window or i < n_global or j < n_global
    return m


def sdpa_oracle(q, k, v, allowed):
    """F.sdpa with bool mask ``allowed`` (B|1, 1, T, T); rows with no key give zeros.

    Empty rows are handed to the kernel as all-True (so it stays finite) and multiplied by 0.
    """
    nonempty = allowed.any(dim=-1, keepdim=True)  # (B|1, 1, T, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~nonempty)
    return out * nonempty


def grads(out, cot, *tensors):
    return torch.autograd.grad(out, tensors, cot, retain_graph=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window,n_global", [(1, 0), (3, 0), (4, 2), (6, 1), (20, 0)])
def test_local_matches_sdpa_with_band_mask(causal, window, n_global):
    B, T = 3, 37
    q, k, v = qkv(B=B, T=T)
    lengths = torch.randint(1, T + 1, (B,))
    lengths[0] = T
    key_mask = padding_mask(lengths, T)  # (B, 1, 1, T)
    allowed = loop_band(T, window, causal, n_global)[None, None] & key_mask  # (B, 1, T, T)
    # block=8 gives several query blocks and slabs that run past both ends of the sequence
    kernel = LocalAttention(window, n_global, block=8)
    ours, _ = kernel(q, k, v, mask=key_mask, is_causal=causal)
    want = sdpa_oracle(q, k, v, allowed)
    torch.testing.assert_close(ours, want)
    cot = torch.randn_like(want)
    for a, b in zip(grads(ours, cot, q, k, v), grads(want, cot, q, k, v), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("causal", [False, True])
def test_local_with_window_covering_everything_is_full_attention(causal):
    B, T = 2, 29
    q, k, v = qkv(B=B, T=T)
    key_mask = padding_mask(torch.tensor([T, 17]), T)
    full, _ = scaled_dot_product_attention(q, k, v, mask=key_mask, is_causal=causal)
    for window in (T, T + 5):
        local, _ = LocalAttention(window, block=8)(q, k, v, mask=key_mask, is_causal=causal)
        torch.testing.assert_close(local, full)
        cot = torch.randn_like(full)
        for a, b in zip(grads(local, cot, q, k, v), grads(full, cot, q, k, v), strict=True):
            torch.testing.assert_close(a, b)


def test_local_blocked_and_dense_paths_agree_with_gqa():
    q, k, v = qkv(B=2, H=4, Hkv=2, T=40, grad=False)
    kernel = LocalAttention(5, n_global=3, block=16)
    fast, none = kernel(q, k, v, is_causal=True)
    dense, weights = kernel(q, k, v, is_causal=True, need_weights=True)  # band mask in full
    assert none is None and weights.shape == (2, 4, 40, 40)
    torch.testing.assert_close(fast, dense)
    assert bool((weights[0, 0, 20, :3] > 0).all()) and bool((weights[0, 0, 20, 3:16] == 0).all())


@pytest.mark.parametrize("causal", [False, True])
def test_global_tokens_see_and_are_seen_by_every_position(causal):
    """Which keys each output row depends on, read from the gradient (no mask code involved)."""
    T, window, g = 24, 2, 3
    q, k, v = qkv(B=1, H=1, T=T)
    out, _ = LocalAttention(window, g, block=8)(q, k, v, is_causal=causal)
    for i in range(T):
        (dk,) = torch.autograd.grad(out[0, 0, i].sum(), k, retain_graph=True)
        seen = {j for j in range(T) if dk[0, 0, j].abs().sum() > 0}
        near = {j for j in range(T) if abs(i - j) < window and (j <= i or not causal)}
        glob = set(range(T)) if i < g else set(range(g))
        want = {j for j in near | glob if j <= i or not causal}
        if len(want) == 1:  # one key: the softmax weight is 1 whatever the score, dk = 0
            continue
        assert seen == want, (i, sorted(seen), sorted(want))


def test_sliding_window_cache_decodes_like_full_recompute():
    window, g, T = 4, 2, 19
    q, k, v = qkv(B=2, H=2, T=T, grad=False)
    kernel = LocalAttention(window, g)
    full, _ = kernel(q, k, v, is_causal=True)
    cache = kernel.new_cache()
    outs = [kernel(q[:, :, :5], k[:, :, :5], v[:, :, :5], is_causal=True, cache=cache)[0]]
    for t in range(5, T):
        sl = slice(t, t + 1)
        outs.append(kernel(q[:, :, sl], k[:, :, sl], v[:, :, sl], is_causal=True, cache=cache)[0])
        assert cache.kept <= g + window - 1  # constant memory
    torch.testing.assert_close(torch.cat(outs, dim=2), full)
    assert cache.length == T


# --------------------------------------------------------------------------- linear


def linear_oracle(q, k, v, causal, key_mask=None):
    """Eq. 2 with sim(q_i, k_j) = φ(q_i)ᵀφ(k_j), φ = elu + 1, one query at a time, float64."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    B, H, T, _ = q.shape
    out = torch.zeros(B, H, T, v.shape[-1], dtype=q.dtype)
    rows = []
    for i in range(T):
        last = i + 1 if causal else T
        sim = (phi_q[:, :, i : i + 1] * phi_k[:, :, :last]).sum(-1)  # (B, H, last)
        if key_mask is not None:
            sim = sim * key_mask[:, :, 0, :last]
        rows.append((sim[..., None] * v[:, :, :last]).sum(2) / sim.sum(-1, keepdim=True))
    out = torch.stack(rows, dim=2)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_equals_the_paper_formula(causal):
    B, T = 3, 23
    q, k, v = qkv(B=B, T=T)
    key_mask = None if causal else padding_mask(torch.tensor([T, 9, 1]), T)
    ours, _ = LinearAttention(chunk=5)(q, k, v, mask=key_mask, is_causal=causal)
    want = linear_oracle(q, k, v, causal, key_mask)
    torch.testing.assert_close(ours, want)
    cot = torch.randn_like(want)
    for a, b in zip(grads(ours, cot, q, k, v), grads(want, cot, q, k, v), strict=True):
        torch.testing.assert_close(a, b)


def test_linear_chunk_size_does_not_change_the_result():
    phi_q, phi_k, v = (F.elu(t) + 1 for t in qkv(B=2, T=50, grad=False))
    ref = linear_attention_causal(phi_q, phi_k, v, chunk=50)
    for chunk in (1, 7, 16, 64):
        torch.testing.assert_close(linear_attention_causal(phi_q, phi_k, v, chunk=chunk), ref)


def test_causal_linear_recurrent_form_equals_parallel_form():
    q, k, v = qkv(B=2, H=4, Hkv=2, T=30, grad=False)
    kernel = LinearAttention(chunk=8)
    parallel, _ = kernel(q, k, v, is_causal=True)
    state = kernel.new_cache()
    outs = [kernel(q[:, :, :3], k[:, :, :3], v[:, :, :3], is_causal=True, cache=state)[0]]
    for t in range(3, 30):
        sl = slice(t, t + 1)
        outs.append(kernel(q[:, :, sl], k[:, :, sl], v[:, :, sl], is_causal=True, cache=state)[0])
    torch.testing.assert_close(torch.cat(outs, dim=2), parallel)
    assert state.S.shape == (2, 4, 8, 8) and state.length == 30


def test_linear_weights_for_inspection_match_the_output():
    q, k, v = qkv(B=1, T=12, grad=False)
    out, weights = LinearAttention()(q, k, v, is_causal=True, need_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 3, 12, dtype=F64))
    assert bool((weights.triu(1) == 0).all())
    torch.testing.assert_close(out, LinearAttention()(q, k, v, is_causal=True)[0])


def test_linear_fully_masked_row_gives_zeros_not_nan():
    q, k, v = qkv(B=2, T=6, grad=False)
    mask = torch.zeros(2, 1, 1, 6, dtype=torch.bool)
    mask[0, ..., :3] = True
    out, _ = LinearAttention()(q, k, v, mask=mask)
    assert torch.isfinite(out).all() and bool((out[1] == 0).all())


# --------------------------------------------------------------------------- modules and models


def test_kernels_hold_no_parameters_so_checkpoints_do_not_change():
    full = MultiHeadAttention(32, 4)
    for kind, window in (("local", 4), ("linear", 0)):
        other = MultiHeadAttention(32, 4, kernel=make_kernel(kind, window))
        assert list(other.state_dict()) == list(full.state_dict())
        other.load_state_dict(full.state_dict())
    wide = MultiHeadAttention(32, 4, kernel=make_kernel("local", 64)).double()
    wide.load_state_dict(full.state_dict())
    x = torch.randn(2, 20, 32, dtype=F64)
    torch.testing.assert_close(wide(x, is_causal=True)[0], full.double()(x, is_causal=True)[0])


def tiny_gpt(**kw) -> GPT:
    cfg = GPTConfig(vocab_size=17, context=40, n_layers=2, n_heads=2, d_model=16, **kw)
    return GPT(cfg).double().eval()


@pytest.mark.parametrize(
    "kw",
    [
        dict(attention="local", window=5),
        dict(attention="local", window=4, n_global=2, pos="rope"),
        dict(attention="local", window=3, pos="alibi", n_kv_heads=1),
        dict(attention="linear"),
        dict(attention="linear", pos="rope"),
    ],
    ids=["local", "local-global-rope", "local-alibi-mqa", "linear", "linear-rope"],
)
def test_gpt_cached_decoding_equals_full_recompute(kw):
    model = tiny_gpt(**kw)
    ids = torch.randint(0, 17, (2, 30))
    with torch.no_grad():
        full = model(ids)  # (B, T, V)
        caches = model.new_caches()
        steps = [model(ids[:, :6], caches=caches)]
        steps += [model(ids[:, t : t + 1], caches=caches) for t in range(6, 30)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_gpt_local_window_at_least_context_equals_full_gpt():
    full = tiny_gpt()
    local = tiny_gpt(attention="local", window=40)
    local.load_state_dict(full.state_dict())
    ids = torch.randint(0, 17, (3, 40))
    with torch.no_grad():
        torch.testing.assert_close(local(ids), full(ids))


@pytest.mark.parametrize("attention,window", [("local", 3), ("linear", 0)])
def test_classifier_takes_the_attention_switch_and_can_be_inspected(attention, window):
    cfg = ClassifierConfig(vocab_size=30, d_model=16, n_heads=2, d_ff=32, n_layers=2)
    cfg.attention, cfg.window = attention, window
    model = TextClassifier(cfg).eval()
    ids = torch.randint(3, 30, (2, 11))
    lengths = torch.tensor([11, 6])
    assert model(ids, lengths).shape == (2, 2)
    info = model.inspect(ids, lengths)
    assert info["attention"].shape == (2, 2, 2, 11, 11)
    if attention == "local":  # position 0 sees only positions 0..2
        assert bool((info["attention"][:, :, :, 0, 3:] == 0).all())


def test_bad_configurations_say_what_to_change():
    with pytest.raises(ValueError, match="window >= 1"):
        check_attention_config("local", 0, 0)
    with pytest.raises(ValueError, match="only apply to attention='local'"):
        check_attention_config("full", 8, 0)
    with pytest.raises(ValueError, match="attention must be one of"):
        check_attention_config("sparse", 0, 0)
    with pytest.raises(ValueError, match="n_global must be >= 0"):
        check_attention_config("local", 4, -1)
    with pytest.raises(ValueError, match="window >= 1"):
        tiny_gpt(attention="local")
    with pytest.raises(ValueError, match="pos='alibi'"):
        tiny_gpt(attention="linear", pos="alibi")
    with pytest.raises(ValueError, match="backend='flash' applies to attention='full'"):
        tiny_gpt(attention="local", window=4, backend="flash")
    backends = "explicit, fused, matmul, flash, triton"
    with pytest.raises(ValueError, match=f"backend must be one of {backends}"):
        check_attention_config("full", 0, 0, "fast")
    q, k, v = qkv(grad=False)
    with pytest.raises(ValueError, match="can only mask keys"):
        LinearAttention()(q, k, v, mask=torch.ones(13, 13, dtype=torch.bool)[None, None])
    with pytest.raises(ValueError, match="LinearAttentionState"):
        LinearAttention()(q, k, v, is_causal=True, cache=SlidingWindowCache(3))
    with pytest.raises(ValueError, match="SlidingWindowCache"):
        LocalAttention(3)(q, k, v, is_causal=True, cache=LinearAttentionState())
    with pytest.raises(ValueError, match="needs causal"):
        LocalAttention(3)(q, k, v, cache=SlidingWindowCache(3))
    mha = MultiHeadAttention(16, 2, kernel=make_kernel("linear"))
    with pytest.raises(ValueError, match="self-attention only"):
        mha(torch.randn(1, 3, 16), torch.randn(1, 4, 16))


def test_what_and_how_are_two_fields() -> None:
    """attention says what is computed, backend how full attention is: attention = "flash" is
    refused naming the choices, backend = "flash" is full attention by the tiled kernel."""
    base = dict(vocab_size=17, context=40, n_layers=2, n_heads=2, d_model=16)
    with pytest.raises(ValueError, match="not one of the choices"):
        from_dict(GPTConfig, {**base, "attention": "flash"})
    cfg = apply_overrides(GPTConfig(**base), {"backend": "flash"})
    assert (cfg.attention, cfg.backend) == ("full", "flash")
    assert apply_overrides(cfg, {"attention": "local", "window": "4", "backend": "fused"}).window
