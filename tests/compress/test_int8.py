"""attnlab.compress.int8: int8 weights equal torch.ao's per-channel int8 weights; the int8 matmul
stays within the bound its scales imply (weight-only and dynamic activations); beside
torch.ao.quantization.quantize_dynamic on the same model; a quantised model saves and loads."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from attnlab.compress.int8 import (
    EPS,
    Int8Linear,
    dynamic_bound,
    int8_matmul,
    quantize_model,
    quantize_per_channel,
    quantize_per_token,
    rescale,
    weight_only_bound,
)
from attnlab.verify.check import Measure
from attnlab.verify.checks_infer import ao_per_channel


@pytest.mark.parametrize("trial", range(5))
def test_weights_equal_torch_ao_per_channel_int8(trial: int) -> None:
    out, inp = torch.randint(1, 50, (2,)).tolist()
    w = torch.randn(out, inp) * torch.rand(out, 1) * 3
    w[0] = 0.0  # an all-zero row: the observer's smallest scale
    q, scale = quantize_per_channel(w)
    q_ao, scale_ao = ao_per_channel(w)
    assert torch.equal(q, q_ao)
    torch.testing.assert_close(scale, scale_ao, rtol=0, atol=0)


@pytest.mark.parametrize("dynamic", [False, True])
def test_int8_matmul_within_the_bound_of_its_scales(dynamic: bool) -> None:
    for trial in range(12):
        inp, out = torch.randint(1, 300, (2,)).tolist()
        inp = 1 if trial == 0 else inp  # an inner size of 1 (torch's _int_mm gets it wrong)
        linear = nn.Linear(inp, out)
        layer = Int8Linear.from_linear(linear, "dynamic" if dynamic else "none")
        x = torch.randn(int(torch.randint(1, 9, ())), inp) * 2
        with torch.no_grad():
            err = (layer(x) - linear(x)).abs()
        bound = dynamic_bound(x, layer) if dynamic else weight_only_bound(x, layer)
        slack = 1e-5 * (1 + linear(x).abs())  # float32 rounding of the two sums
        assert (err <= bound + slack).all(), (err - bound).max()
        assert err.max() > 0  # it is quantised


def test_per_token_quantisation_needs_no_clamp() -> None:
    """Rows of every kind (all zero, below 127·ε, huge, maximum on the negative side, random):
    the unclamped rounding equals clamp(round(x / t), -127, 127), and each row's largest entry
    lands on ±127 unless t was raised to ε."""
    x = torch.randn(8, 50) * torch.logspace(-3, 3, 8)[:, None]
    x[0] = 0.0
    x[1] = torch.randn(50) * EPS  # max |x| < 127 ε: t = ε
    x[2] = torch.randn(50) * 1e30
    x[3, 7] = -x[3].abs().max() * 2  # the largest magnitude is negative
    q, t = quantize_per_token(x)
    assert q.dtype == torch.int8 and t.shape == (8, 1)
    assert torch.equal(q, torch.clamp(torch.round(x / t), -127, 127).to(torch.int8))
    at_full_scale = (x.abs().amax(dim=1) / 127.0) >= EPS
    assert torch.equal(q.abs().amax(dim=1)[at_full_scale], torch.full((6,), 127, dtype=torch.int8))
    assert q[3, 7] == -127


@pytest.mark.parametrize("inner", [1, 2, 37, 384])
def test_int8_matmul_is_exact(inner: int) -> None:
    """The int32 product equals the int64 one: no rounding, no overflow at the extremes."""
    xq = torch.randint(-127, 128, (19, inner), dtype=torch.int8)
    q = torch.randint(-128, 128, (23, inner), dtype=torch.int8)
    xq[0], q[0] = -127, -128  # the largest magnitude a sum can reach
    got = int8_matmul(xq, q)
    assert got.dtype == torch.int32
    assert torch.equal(got.long(), xq.long() @ q.long().t())


@pytest.mark.parametrize("with_bias", [False, True])
def test_rescale_writes_over_the_accumulator(with_bias: bool) -> None:
    """t_n s_i acc_ni + b_i, computed in acc's own memory (no (N, out) allocation)."""
    acc = torch.randint(-(2**24), 2**24, (9, 31), dtype=torch.int32)
    t, s = torch.rand(9, 1) + 0.1, torch.rand(31) + 0.1
    bias = torch.randn(31) if with_bias else None
    want = acc.double() * t.double() * s.double() + (0 if bias is None else bias.double())
    pointer = acc.data_ptr()
    with torch.no_grad():
        got = rescale(acc, t, s, bias)
    assert got.dtype == torch.float32 and got.data_ptr() == pointer
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dynamic", [False, True])
def test_forward_under_autograd_equals_inference(dynamic: bool) -> None:
    """With gradients recorded the layer gives the output it gives under no_grad (there it
    fuses the scale and the bias into one addcmul: equal up to float32 rounding), and its
    gradients are the dequantised layer's: the bias gets the summed output gradient; the
    input (weight-only) gets the product with the dequantised weight."""
    layer = Int8Linear.from_linear(nn.Linear(24, 16), "dynamic" if dynamic else "none")
    x = torch.randn(3, 5, 24, requires_grad=True)
    with torch.no_grad():
        want = layer(x)
    got = layer(x)
    torch.testing.assert_close(got, want)
    grad = torch.randn_like(got)
    got.backward(grad)
    torch.testing.assert_close(layer.bias.grad, grad.sum(dim=(0, 1)))
    if not dynamic:
        torch.testing.assert_close(x.grad, grad @ layer.weight)


def test_the_bound_is_tight_enough_to_catch_a_wrong_scale() -> None:
    linear = nn.Linear(64, 32)
    layer = Int8Linear.from_linear(linear)
    layer.weight_scale.mul_(1.02)  # 2% off: outside the bound
    x = torch.randn(8, 64)
    with torch.no_grad():
        assert ((layer(x) - linear(x)).abs() > weight_only_bound(x, layer)).any()


def test_beside_torch_ao_quantize_dynamic() -> None:
    """On the same MLP: attnlab's weight-only int8 is at least as close to fp32 as torch.ao's
    dynamic int8 (which also quantises activations); attnlab's dynamic mode is within 2x."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 64))
    x = torch.randn(32, 128)
    ref = mlp(x).detach()
    ao = torch.ao.quantization.quantize_dynamic(mlp, {nn.Linear}, dtype=torch.qint8)
    err_ao = (ao(x) - ref).abs().mean()
    errs = {}
    for acts in ("none", "dynamic"):
        ours = copy.deepcopy(mlp)
        assert quantize_model(ours, acts) == ["0", "2"]
        errs[acts] = (ours(x) - ref).abs().mean()
    assert errs["none"] <= err_ao
    assert errs["dynamic"] <= 2 * err_ao


def test_verify_check_passes() -> None:
    from attnlab.verify.checks_infer import check_int8

    m = Measure()
    check_int8(m)
    assert not m.failures and m.cases > 0


def test_tied_head_stays_float_and_model_round_trips(tmp_path) -> None:
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.train.checkpoint import load_weights, save_weights

    cfg = GPTConfig(vocab_size=13, context=16, n_layers=2, n_heads=2, d_model=16)
    model = GPT(cfg).eval()
    names = quantize_model(model, "dynamic")
    assert "head" not in names and type(model.head) is nn.Linear
    assert len(names) == 2 * 5  # q_proj, kv_proj, out_proj, w_in, w_out per layer
    save_weights(model, tmp_path / "w.safetensors")
    fresh = GPT(cfg).eval()
    load_weights(fresh, tmp_path / "w.safetensors")
    assert isinstance(fresh.stack.blocks[0].self_attn.kv_proj, Int8Linear)
    assert fresh.stack.blocks[0].self_attn.kv_proj.dynamic
    ids = torch.randint(0, 13, (2, 10))
    torch.testing.assert_close(fresh(ids), model(ids), rtol=0, atol=0)
