"""SE, ECA, CBAM, coordinate attention and the ResNet they plug into, against hand computations."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.layers.channel import (
    CBAM,
    ECA,
    CoordinateAttention,
    SqueezeExcite,
    eca_kernel_size,
    make_attention,
)
from attnlab.models.cnn import CNNConfig, ResNetCNN


def _x() -> torch.Tensor:
    return torch.randn(2, 32, 6, 5) + 3.0  # away from zero so y / x is well defined


def test_se_is_a_per_channel_gate_equal_to_the_paper_formula() -> None:
    se = SqueezeExcite(32, reduction=8)
    x = _x()
    y = se(x)
    ratio = y / x
    # One factor per (image, channel), in (0, 1), constant over H and W.
    assert torch.allclose(ratio, ratio[:, :, :1, :1].expand_as(ratio), atol=1e-5)
    assert ((ratio > 0) & (ratio < 1)).all()
    w1, b1, w2, b2 = se.fc1.weight, se.fc1.bias, se.fc2.weight, se.fc2.bias
    ref = []
    for n in range(2):
        z = torch.stack([x[n, c].sum() / 30 for c in range(32)])  # squeeze, eq. 2
        s = 1 / (1 + torch.exp(-(w2 @ torch.clamp(w1 @ z + b1, min=0) + b2)))  # eq. 3
        ref.append(x[n] * s[:, None, None])  # eq. 4
    torch.testing.assert_close(y, torch.stack(ref), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("channels", "k"), [(16, 3), (32, 3), (64, 3), (128, 5), (512, 5)])
def test_eca_kernel_size_follows_equation_12(channels: int, k: int) -> None:
    raw = abs(math.log2(channels) / 2 + 0.5)
    assert eca_kernel_size(channels) == k
    assert k % 2 == 1 and abs(k - raw) <= 1


def test_eca_convolves_neighbouring_channels_only() -> None:
    eca = ECA(32)
    k = eca.conv.kernel_size[0]
    x = _x()
    ratio = eca(x) / x
    assert torch.allclose(ratio, ratio[:, :, :1, :1].expand_as(ratio), atol=1e-5)
    assert ((ratio > 0) & (ratio < 1)).all()
    z = x.mean(dim=(2, 3))  # (B, C)
    w = eca.conv.weight.view(k)
    zp = F.pad(z, (k // 2, k // 2))
    s = torch.sigmoid(torch.stack([(zp[:, c : c + k] * w).sum(-1) for c in range(32)], dim=1))
    torch.testing.assert_close(ratio[:, :, 0, 0], s, atol=1e-5, rtol=1e-5)
    # Changing channel 0 moves only the gates of channels within k // 2 of it.
    x2 = x.clone()
    x2[:, 0] += 5.0
    changed = (eca.gate(x2) - eca.gate(x)).abs()[0, :, 0, 0] > 1e-7
    assert changed[: k // 2 + 1].all() and not changed[k // 2 + 1 :].any()


def test_cbam_is_channel_then_spatial_gating() -> None:
    cbam = CBAM(32, reduction=8)
    x = _x()
    mlp = cbam.channel.mlp
    mc = torch.sigmoid(mlp(x.mean(dim=(2, 3))) + mlp(x.amax(dim=(2, 3))))  # eq. 2
    x1 = x * mc[:, :, None, None]
    avg, mx = x1.mean(dim=1, keepdim=True), x1.amax(dim=1, keepdim=True)
    ms = torch.sigmoid(F.conv2d(torch.cat([avg, mx], 1), cbam.spatial.conv.weight, padding=3))
    torch.testing.assert_close(cbam(x), x1 * ms, atol=1e-5, rtol=1e-5)  # eq. 1
    gate = cbam.gate(x)
    assert ((gate > 0) & (gate < 1)).all()
    torch.testing.assert_close(cbam(x), x * gate, atol=1e-5, rtol=1e-5)


def test_coordinate_attention_scales_rows_and_columns() -> None:
    ca = CoordinateAttention(32, reduction=4).eval()
    with torch.no_grad():
        ca.bn.running_mean.normal_()
        ca.bn.running_var.uniform_(0.5, 2.0)
    x = _x()
    y = ca(x)
    ratio = y / x
    assert ((ratio > 0) & (ratio < 1)).all()
    # A product g_h(i) · g_w(j): every (image, channel) slice of the ratio has rank one.
    for n in range(2):
        for c in range(0, 32, 7):
            assert torch.linalg.matrix_rank(ratio[n, c], atol=1e-5) == 1
    # Hand computation of eqs. 4-9, with the BN in eval mode written out.
    bn = ca.bn
    ref = torch.empty_like(x)
    for n in range(2):
        z = torch.cat([x[n].mean(dim=2), x[n].mean(dim=1)], dim=1)  # (C, H + W)
        f = ca.conv1.weight[:, :, 0, 0] @ z + ca.conv1.bias[:, None]
        f = (f - bn.running_mean[:, None]) / torch.sqrt(bn.running_var[:, None] + bn.eps)
        f = f * bn.weight[:, None] + bn.bias[:, None]
        f = f * torch.clamp(f + 3, 0, 6) / 6  # h-swish
        g_h = torch.sigmoid(ca.conv_h.weight[:, :, 0, 0] @ f[:, :6] + ca.conv_h.bias[:, None])
        g_w = torch.sigmoid(ca.conv_w.weight[:, :, 0, 0] @ f[:, 6:] + ca.conv_w.bias[:, None])
        ref[n] = x[n] * g_h[:, :, None] * g_w[:, None, :]
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)


def test_make_attention_rejects_unknown_names() -> None:
    assert isinstance(make_attention("none", 8), torch.nn.Identity)
    with pytest.raises(ValueError, match="se, eca, cbam, ca"):
        make_attention("sk", 8)  # type: ignore[arg-type]


@pytest.mark.parametrize("attention", ["none", "se", "eca", "cbam", "ca"])
def test_resnet_with_each_attention(attention: str) -> None:
    cfg = CNNConfig(
        in_channels=1, width=8, stages=2, blocks_per_stage=1, channel_attention=attention
    )
    model = ResNetCNN(cfg)
    logits = model(torch.randn(3, 1, 12, 12))
    assert logits.shape == (3, 10)
    logits.sum().backward()
    kinds = {type(b.attention).__name__ for b in model.blocks}
    expected = {
        "none": "Identity",
        "se": "SqueezeExcite",
        "eca": "ECA",
        "cbam": "CBAM",
        "ca": "CoordinateAttention",
    }[attention]
    assert kinds == {expected}
    if attention != "none":
        assert any(
            p.grad is not None and p.grad.abs().sum() > 0
            for p in model.blocks[0].attention.parameters()
        )


def test_resnet_config_errors() -> None:
    with pytest.raises(ValueError, match="attention"):
        CNNConfig(channel_attention="sk")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="in_channels|shape"):
        ResNetCNN(CNNConfig(in_channels=3))(torch.randn(1, 1, 8, 8))
