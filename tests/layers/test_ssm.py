"""Mamba (attnlab.layers.ssm): the two scans agree, the cache decodes what the full forward
computes, and the Mamba GPT equals Hugging Face's MambaForCausalLM with copied weights.

* chunked (parallel) scan == sequential loop in float64, outputs, last state and the gradients
  of every input, for lengths that are and are not multiples of the chunk, with an initial state;
* MambaBlock with either scan: outputs and every parameter gradient equal in float64;
* MambaCache: prefill + one-token steps + a multi-token chunk == one forward over the whole;
* the GPT with mixer "mamba" vs ``transformers.MambaForCausalLM`` (its PyTorch path: no CUDA
  kernels are installed here, and ``use_associative_scan`` / ``use_mambapy`` are off, so HF runs
  its sequential loop): logits to 1e-5 in float32, every parameter gradient, greedy
  continuations token for token (verify's checks, called here).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.layers.ssm import MambaBlock, selective_scan_chunked, selective_scan_sequential

F64 = torch.float64


def scan_inputs(batch: int, T: int, D: int, N: int, dtype=F64) -> list[torch.Tensor]:
    x = torch.randn(batch, T, D, dtype=dtype)
    delta = torch.nn.functional.softplus(torch.randn(batch, T, D, dtype=dtype))  # > 0
    A = -torch.rand(D, N, dtype=dtype) * 4 - 0.1  # < 0
    B = torch.randn(batch, T, N, dtype=dtype)
    C = torch.randn(batch, T, N, dtype=dtype)
    h0 = torch.randn(batch, D, N, dtype=dtype)
    return [t.requires_grad_() for t in (x, delta, A, B, C, h0)]


def assert_chunked_equals_loop(args, **kwargs) -> None:
    """The chunked scan (with ``kwargs``) equals the sequential loop in float64: outputs,
    final state, and the gradients of every input for random output gradients."""
    y1, h1 = selective_scan_sequential(*args)
    y2, h2 = selective_scan_chunked(*args, **kwargs)
    torch.testing.assert_close(y2, y1, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(h2, h1, rtol=1e-10, atol=1e-12)
    gy, gh = torch.randn_like(y1), torch.randn_like(h1)
    grads1 = torch.autograd.grad((y1 * gy).sum() + (h1 * gh).sum(), args)
    grads2 = torch.autograd.grad((y2 * gy).sum() + (h2 * gh).sum(), args)
    for name, g1, g2 in zip(("x", "delta", "A", "B", "C", "h0"), grads1, grads2):
        torch.testing.assert_close(g2, g1, rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize(
    "T, chunk", [(1, 64), (7, 4), (16, 4), (37, 8), (50, 64), (33, 1), (70, 32)]
)
@pytest.mark.parametrize("with_h0", [False, True])
def test_chunked_scan_equals_sequential_forward_and_backward(T, chunk, with_h0):
    inputs = scan_inputs(2, T, 5, 3)
    args = inputs if with_h0 else inputs[:5]
    assert_chunked_equals_loop(args, chunk=chunk)


@pytest.mark.parametrize("block, chunk", [(60, 0), (60, 3), (1500, 0), (1500, 16)])
def test_blocks_of_rows_and_stretches_of_time_chain_their_states(block, chunk):
    """With D·N = 15, block 60 scans 4 steps of one row at a time (3 rows × 10 stretches),
    block 1500 all 37 steps of 2 rows (a group of 2, then 1): the state and its gradient
    pass from each stretch to the next, float64, equal to the loop."""
    args = scan_inputs(3, 37, 5, 3)
    assert_chunked_equals_loop(args, chunk=chunk, block=block)


def test_chunked_scan_stays_finite_with_large_steps():
    """Large Δ|A| (fast decay) over long chunks: the parallel scan must not overflow."""
    x, delta, A, B, C, _ = scan_inputs(1, 300, 4, 2, dtype=torch.float32)
    with torch.no_grad():
        delta.mul_(50.0)
    y1, _ = selective_scan_sequential(x, delta, A, B, C)
    y2, _ = selective_scan_chunked(x, delta, A, B, C, chunk=128)
    assert torch.isfinite(y2).all()
    torch.testing.assert_close(y2, y1, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("conv_bias", [False, True])
def test_conv_equals_conv1d_with_its_gradients(conv_bias):
    """The block's causal depthwise conv (shifted multiply-adds, hand-written backward) equals
    F.conv1d, left-padded, then SiLU: output and the gradients of input, weight, bias (float64)."""
    block = MambaBlock(12, d_state=4, d_conv=4, expand=2, conv_bias=conv_bias).double()
    u = torch.randn(3, 9, 24, dtype=F64)
    u1, u2 = u.clone().requires_grad_(), u.clone().requires_grad_()
    y1 = block._conv(u1, None)
    w, b = block.conv1d.weight, block.conv1d.bias
    w2 = w.detach().clone().requires_grad_()
    b2 = None if b is None else b.detach().clone().requires_grad_()
    y2 = F.silu(F.conv1d(F.pad(u2.transpose(1, 2), (3, 0)), w2, b2, groups=24).transpose(1, 2))
    torch.testing.assert_close(y1, y2, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(y1)
    (y1 * g).sum().backward()
    (y2 * g).sum().backward()
    torch.testing.assert_close(u1.grad, u2.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w.grad, w2.grad, rtol=1e-12, atol=1e-12)
    if conv_bias:
        torch.testing.assert_close(b.grad, b2.grad, rtol=1e-12, atol=1e-12)


def block_pair(**kw) -> tuple[MambaBlock, MambaBlock]:
    fast = MambaBlock(12, d_state=4, d_conv=3, expand=2, scan="chunked", chunk=8, **kw).double()
    slow = MambaBlock(12, d_state=4, d_conv=3, expand=2, scan="sequential", **kw).double()
    with torch.no_grad():
        for p in fast.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # off the structured init (A = -(1..N), D = 1)
    slow.load_state_dict(fast.state_dict())
    return fast, slow


@pytest.mark.parametrize("bias", [False, True])
def test_block_scans_agree_on_outputs_and_every_gradient(bias):
    fast, slow = block_pair(bias=bias)
    x = torch.randn(3, 21, 12, dtype=F64)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = fast(x1), slow(x2)
    torch.testing.assert_close(y1, y2, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(y1)
    (y1 * g).sum().backward()
    (y2 * g).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-11)
    for (name, p1), p2 in zip(fast.named_parameters(), slow.parameters()):
        assert p1.grad is not None and p1.grad.abs().sum() > 0, name
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize("scan", ["chunked", "sequential"])
def test_cached_decoding_equals_the_full_forward(scan):
    block, _ = block_pair()
    block.scan = scan
    x = torch.randn(2, 19, 12, dtype=F64)
    with torch.no_grad():
        want = block(x)
        cache = block.new_cache()
        pieces = [block(x[:, :5], cache)]  # prefill
        pieces += [block(x[:, t : t + 1], cache) for t in range(5, 12)]  # recurrent steps
        pieces.append(block(x[:, 12:], cache))  # several tokens from the cached state
    torch.testing.assert_close(torch.cat(pieces, dim=1), want, rtol=1e-10, atol=1e-12)
    assert cache.length == 19
    assert cache.conv.shape == (2, 24, 2) and cache.ssm.shape == (2, 24, 4)
    assert cache.nbytes() == (2 * 24 * 2 + 2 * 24 * 4) * 8


def test_cache_reorder_keeps_rows():
    block, _ = block_pair()
    x = torch.randn(3, 6, 12, dtype=F64)
    with torch.no_grad():
        cache = block.new_cache()
        block(x, cache)
        nxt = torch.randn(3, 1, 12, dtype=F64)
        full = block(nxt, cache)
        cache2 = block.new_cache()
        block(x, cache2)
        cache2.reorder(torch.tensor([2, 0]))
        part = block(nxt[[2, 0]], cache2)
    torch.testing.assert_close(part, full[[2, 0]], rtol=0, atol=1e-14)  # batched matmul rounding


def test_bad_configurations_name_the_field():
    for kw, words in (
        (dict(d_state=0), "d_state"),
        (dict(d_conv=0), "d_conv"),
        (dict(expand=0), "expand"),
        (dict(dt_rank=-1), "dt_rank"),
        (dict(scan="fft"), "scan"),
    ):
        with pytest.raises(ValueError, match=words):
            MambaBlock(8, **kw)
    with pytest.raises(ValueError, match="chunk"):
        selective_scan_chunked(*scan_inputs(1, 4, 2, 2)[:5], chunk=-1)
    with pytest.raises(ValueError, match="block"):
        selective_scan_chunked(*scan_inputs(1, 4, 2, 2)[:5], block=0)
    with pytest.raises(ValueError, match=r"\(B, T, d_model\)"):
        MambaBlock(8)(torch.randn(4, 8))


# --------------------------------------------------------------------------- Hugging Face


@pytest.mark.parametrize("what", ["logits/greedy/cache", "gradients"])
def test_the_mamba_gpt_matches_hugging_face(what):
    """The GPT with mixer "mamba", ffn "none" (weights copied from a random MambaForCausalLM):
    logits to 1e-5 with either scan, greedy output token for token against HF's generate,
    cached decoding == the full forward, every parameter gradient (verify's checks, held to
    verify's tolerances)."""
    pytest.importorskip("transformers")
    from _verify import assert_verified
    from attnlab.verify import checks_mixers
    from attnlab.verify.check import Measure

    check = {
        "logits/greedy/cache": checks_mixers.check_mamba_logits,
        "gradients": checks_mixers.check_mamba_grads,
    }[what]
    m = Measure()
    check(m)
    assert_verified(m, f"Mamba GPT {what} (f32)")


@pytest.mark.parametrize("T", [1, 6, 19])
def test_hidden_attention_reproduces_the_scan(T):
    """y_t = Σ_s α[t, s] x_s from a zero state (Ali et al. 2024), float64, against the scan."""
    from attnlab.layers.ssm import hidden_attention

    x, delta, A, B, C, _ = (t.detach() for t in scan_inputs(2, T, 5, 3))
    alpha = hidden_attention(delta, A, B, C)  # (b, D, T, T)
    want, _ = selective_scan_sequential(x, delta, A, B, C)  # (b, T, D)
    torch.testing.assert_close(torch.einsum("bdts,bsd->btd", alpha, x), want,
                               rtol=1e-10, atol=1e-12)  # fmt: skip
    assert (alpha.triu(1) == 0).all()


def test_a_mamba_layer_records_its_normalised_hidden_attention():
    from attnlab.layers.attention_record import record_attention

    block = MambaBlock(8, d_state=4, d_conv=3, expand=2, dt_rank=2).double()
    block.view_heads = 4
    with record_attention(block) as rec:
        block(torch.randn(2, 7, 8, dtype=torch.float64))
    (call,) = rec.calls
    assert call.weights.shape == (2, 4, 7, 7) and call.is_causal
    torch.testing.assert_close(call.weights.sum(-1), torch.ones(2, 4, 7, dtype=torch.float64))
    assert (call.weights >= 0).all() and (call.weights.triu(1) == 0).all()
