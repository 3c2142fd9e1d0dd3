"""attnlab.quant: int8 weights equal torch.ao's per-channel int8 weights; the int8 matmul stays
within the bound its scales imply (weight-only and dynamic activations); beside
torch.ao.quantization.quantize_dynamic on the same model; a quantised model saves and loads."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from attnlab.quant import (
    Int8Linear,
    dynamic_bound,
    quantize_model,
    quantize_per_channel,
    weight_only_bound,
)
from attnlab.verify.checks_infer import ao_per_channel
from attnlab.verify.runner import Measure


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
