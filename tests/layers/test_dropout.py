"""attnlab's dropout == ``F.dropout`` in everything but the random stream.

* evaluation, p = 0: the input itself; p = 1: zeros (torch's path);
* training: every output is 0 or x / (1 − p) computed as ``F.dropout`` computes it (the mask
  divided by 1 − p in x's dtype, then multiplied), float32 and bf16; the gradient is the same
  mask (backward through the product);
* the mask's statistics over ~10⁶ draws: keep rate 1 − p and independent neighbours (both
  halves of a 64-bit word), within 6 standard deviations, for p from 10⁻³ to 0.9; the seed and a
  restored RNG state reproduce it;
* ``Dropout`` is an ``nn.Dropout`` (same p, no state), the one attnlab's blocks and BERT use;
* under ``torch.compile`` it is ``F.dropout``: a block traces as one graph.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.layers.blocks import Block, BlockConfig
from attnlab.layers.dropout import Dropout, dropout, keep_mask


def test_eval_and_zero_p_return_the_input_and_p_one_zeros() -> None:
    x = torch.randn(4, 5)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        dropout(x, 1.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_training_output_and_gradient_are_f_dropouts_arithmetic(
    dtype: torch.dtype, p: float
) -> None:
    x = torch.randn(64, 33).to(dtype).requires_grad_()
    y = dropout(x, p)
    kept = y != 0
    scale = torch.ones((), dtype=dtype).div_(1 - p)  # F.dropout's m / (1 - p) in x's dtype
    assert torch.equal(y[kept], (x * scale)[kept]) and 0 < kept.sum() < x.numel()
    assert y.dtype == dtype
    g = torch.randn_like(x)
    (grad,) = torch.autograd.grad(y, x, g)
    assert torch.equal(grad, torch.where(kept, g * scale, 0))


@pytest.mark.parametrize("p", [1e-3, 0.1, 0.5, 0.9])
def test_the_mask_keeps_one_minus_p_independently(p: float) -> None:
    n = 1 << 20
    keep = keep_mask((n,), p, torch.float64)
    assert set(keep.unique().tolist()) <= {0.0, 1.0}
    q = 1 - p
    rate = keep.mean().item()
    assert abs(rate - q) < 6 * math.sqrt(q * (1 - q) / n), rate
    pairs = keep.view(-1, 2)  # the two 32-bit halves of one 64-bit word
    for both in (pairs[:, 0] * pairs[:, 1], keep[1:-1:2] * keep[2::2]):  # within, across words
        m, target = both.numel(), q * q
        assert abs(both.mean().item() - target) < 6 * math.sqrt(target * (1 - target) / m)


def test_odd_sizes_and_reproducibility() -> None:
    torch.manual_seed(5)
    a = keep_mask((3, 7, 5), 0.3, torch.float32)
    state = torch.get_rng_state()
    b = keep_mask((3, 7, 5), 0.3, torch.float32)
    torch.set_rng_state(state)
    c = keep_mask((3, 7, 5), 0.3, torch.float32)
    torch.manual_seed(5)
    assert torch.equal(keep_mask((3, 7, 5), 0.3, torch.float32), a)
    assert torch.equal(b, c) and a.shape == (3, 7, 5)


def test_dropout_module_is_an_nn_dropout_that_blocks_use() -> None:
    m = Dropout(0.25)
    assert isinstance(m, nn.Dropout) and m.p == 0.25 and not m.inplace
    assert m.state_dict() == {} and "p=0.25" in repr(m)
    x = torch.randn(8, 16)
    m.eval()
    assert m(x) is x
    block = Block(BlockConfig(16, 2, 32, dropout=0.2))
    drops = [mod for mod in block.modules() if isinstance(mod, nn.Dropout)]
    assert drops and all(type(mod) is Dropout for mod in drops)


def test_a_compiled_block_traces_as_one_graph_through_its_dropouts() -> None:
    # fullgraph=True fails on a graph break: the in-place random_ of the CPU mask would be one
    torch.manual_seed(0)
    block = Block(BlockConfig(d_model=16, n_heads=2, d_ff=32, dropout=0.5, attn_dropout=0.0))
    block.train()
    compiled = torch.compile(block, backend="eager", fullgraph=True)
    out, _ = compiled(torch.randn(3, 5, 16))
    assert out.shape == (3, 5, 16)
