"""attnlab.layers.flash: the hand-tiled FlashAttention equals F.scaled_dot_product_attention.

* forward and dq, dk, dv in float64 over random shapes, masks (none, key padding, random,
  per head with an empty row), causal (bottom-right, Tk >= Tq) or not, GQA, and block sizes
  that do not divide T (property test; the case and its seed are printed on failure);
* the leading-dimension conventions of scaled_dot_product_attention (3-D, 5-D inputs);
* the backward saves only O and the log-sum-exp besides the inputs (no T×T tensor);
* as a GPT backend (backend="flash"): same logits, gradients and cached decoding as "full".
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.layers.attention import scaled_dot_product_attention
from attnlab.layers.flash import flash_attention
from attnlab.verify.check import Measure
from attnlab.verify.checks_infer import flash_case

F64 = torch.float64


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_flash_equals_torch_sdpa_forward_and_gradients(seed: int) -> None:
    m = Measure()
    case = flash_case(m, torch.Generator().manual_seed(seed))
    assert not m.failures, (seed, case, m.failures)
    assert m.error < 1e-10, (seed, case, m.error)


@pytest.mark.parametrize("shape", [(5, 8), (2, 9, 4), (2, 3, 2, 11, 4)])
def test_flash_takes_any_leading_dimensions(shape) -> None:
    q, k, v = (torch.randn(shape, dtype=F64) for _ in range(3))
    mask = torch.rand(shape[-2], shape[-2]) > 0.4  # 2-D: shared by everything
    want, _ = scaled_dot_product_attention(q, k, v, mask, is_causal=True, backend="explicit")
    got = flash_attention(q, k, v, mask, True, block_q=3, block_k=4)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_backward_keeps_only_output_and_logsumexp() -> None:
    T = 96
    q, k, v = (torch.randn(1, 2, T, 8, dtype=F64, requires_grad=True) for _ in range(3))
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        flash_attention(q, k, v, is_causal=True, block_q=16, block_k=16)
    assert len(saved) == 5  # q, k, v, O, log-sum-exp: everything the whole graph keeps
    assert all(t.numel() <= q.numel() for t in saved)  # nothing of size T×T


def test_flash_refuses_bad_input() -> None:
    q = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match="Tk >= Tq"):
        flash_attention(q, q[:, :, :2], q[:, :, :2], is_causal=True)
    with pytest.raises(ValueError, match="block sizes"):
        flash_attention(q, q, q, block_q=0)
    with pytest.raises(ValueError, match="bool"):
        flash_attention(q, q, q, torch.ones(4, 4))


def test_gpt_with_flash_kernel_equals_full_attention() -> None:
    from attnlab.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    base = dict(vocab_size=11, context=40, n_layers=2, n_heads=4, n_kv_heads=2, d_model=16)
    full = GPT(GPTConfig(**base)).double()
    flash = GPT(GPTConfig(**base, backend="flash")).double()
    flash.load_state_dict(full.state_dict())
    ids = torch.randint(0, 11, (2, 33))
    a, b = full(ids), flash(ids)
    torch.testing.assert_close(b, a, rtol=0, atol=1e-10)
    F.cross_entropy(a.flatten(0, 1), ids.flatten()).backward()
    F.cross_entropy(b.flatten(0, 1), ids.flatten()).backward()
    for (name, p), q in zip(full.named_parameters(), flash.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=1e-10, msg=name)
    caches = flash.new_caches()  # decoding with a cache: prefill, then one token at a time
    steps = [flash(ids[:, :20], caches)[:, -1]]
    steps += [flash(ids[:, t : t + 1], caches)[:, -1] for t in range(20, 33)]
    torch.testing.assert_close(torch.stack(steps[:-1], 1), a[:, 19:32], rtol=0, atol=1e-10)
