"""Channel and spatial attention for CNN feature maps: SE, ECA, CBAM, coordinate attention.

Each module maps (B, C, H, W) -> (B, C, H, W) by multiplying the input with sigmoid gates in
(0, 1); ``gate(x)`` returns the broadcastable gate itself so the scaling can be inspected.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ChannelAttentionKind = Literal["none", "se", "eca", "cbam", "ca"]


def _hidden(channels: int, reduction: int, minimum: int) -> int:
    """Bottleneck width C/r, at least ``minimum``."""
    if reduction < 1:
        raise ValueError(f"reduction must be >= 1, got {reduction}")
    return max(channels // reduction, minimum)


class SqueezeExcite(nn.Module):
    """SE (Hu et al. 2018, eqs. 2-4): s = σ(W2 δ(W1 GAP(x))), y = s_c · x_c."""

    def __init__(self, channels: int, reduction: int = 16) -> None:
        super().__init__()
        hidden = _hidden(channels, reduction, 4)
        self.fc1 = nn.Linear(channels, hidden)
        self.fc2 = nn.Linear(hidden, channels)

    def gate(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, C, 1, 1)."""
        z = x.mean(dim=(2, 3))  # (B, C): squeeze
        s = torch.sigmoid(self.fc2(F.relu(self.fc1(z))))  # (B, C): excitation
        return s[:, :, None, None]

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gate(x)


def eca_kernel_size(channels: int, gamma: float = 2.0, b: float = 1.0) -> int:
    """ECA's adaptive kernel k = |log2(C)/γ + b/γ|_odd  (Wang et al. 2020, eq. 12)."""
    k = int(abs(math.log2(channels) / gamma + b / gamma))
    return k if k % 2 else k + 1


class ECA(nn.Module):
    """ECA (Wang et al. 2020): s = σ(Conv1D_k(GAP(x))) over the channel axis; y = s_c · x_c."""

    def __init__(self, channels: int, gamma: float = 2.0, b: float = 1.0) -> None:
        super().__init__()
        k = eca_kernel_size(channels, gamma, b)
        self.conv = nn.Conv1d(1, 1, kernel_size=k, padding=k // 2, bias=False)

    def gate(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, C, 1, 1)."""
        z = x.mean(dim=(2, 3))[:, None, :]  # (B, 1, C)
        return torch.sigmoid(self.conv(z))[:, 0, :, None, None]  # (B, C, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gate(x)


class CBAMChannel(nn.Module):
    """CBAM channel gate (Woo et al. 2018, eq. 2): M_c = σ(MLP(AvgPool(x)) + MLP(MaxPool(x)))."""

    def __init__(self, channels: int, reduction: int = 16) -> None:
        super().__init__()
        hidden = _hidden(channels, reduction, 4)
        self.mlp = nn.Sequential(
            nn.Linear(channels, hidden), nn.ReLU(), nn.Linear(hidden, channels)
        )

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> gate (B, C, 1, 1)."""
        avg, mx = x.mean(dim=(2, 3)), x.amax(dim=(2, 3))  # (B, C) each
        return torch.sigmoid(self.mlp(avg) + self.mlp(mx))[:, :, None, None]


class CBAMSpatial(nn.Module):
    """CBAM spatial gate (eq. 3): M_s = σ(f^{7×7}([AvgPool_c(x); MaxPool_c(x)]))."""

    def __init__(self, kernel_size: int = 7) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 1, kernel_size, padding=kernel_size // 2, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> gate (B, 1, H, W)."""
        pooled = torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1)
        return torch.sigmoid(self.conv(pooled))  # (B, 1, H, W)


class CBAM(nn.Module):
    """CBAM (Woo et al. 2018, eq. 1): x' = M_c(x) ⊗ x, then y = M_s(x') ⊗ x'."""

    def __init__(self, channels: int, reduction: int = 16, kernel_size: int = 7) -> None:
        super().__init__()
        self.channel = CBAMChannel(channels, reduction)
        self.spatial = CBAMSpatial(kernel_size)

    def gate(self, x: Tensor) -> Tensor:
        """The total factor y / x: M_c(x) · M_s(M_c(x) ⊗ x), (B, C, H, W)."""
        mc = self.channel(x)  # (B, C, 1, 1)
        return mc * self.spatial(x * mc)

    def forward(self, x: Tensor) -> Tensor:
        x = x * self.channel(x)
        return x * self.spatial(x)


class CoordinateAttention(nn.Module):
    """Coordinate attention (Hou et al. 2021, eqs. 4-9): pool along each axis, a shared 1×1
    transform F1 with BN and h-swish, then y_c(i, j) = x_c(i, j) · g^h_c(i) · g^w_c(j)."""

    def __init__(self, channels: int, reduction: int = 32) -> None:
        super().__init__()
        hidden = _hidden(channels, reduction, 8)
        self.conv1 = nn.Conv2d(channels, hidden, 1)
        self.bn = nn.BatchNorm2d(hidden)
        self.conv_h = nn.Conv2d(hidden, channels, 1)
        self.conv_w = nn.Conv2d(hidden, channels, 1)

    def gates(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, C, H, W) -> g^h (B, C, H, 1) and g^w (B, C, 1, W)."""
        _, _, h, w = x.shape
        z_h = x.mean(dim=3, keepdim=True)  # (B, C, H, 1): eq. 4
        z_w = x.mean(dim=2, keepdim=True).transpose(2, 3)  # (B, C, W, 1): eq. 5
        f = F.hardswish(self.bn(self.conv1(torch.cat([z_h, z_w], dim=2))))  # (B, C/r, H+W, 1)
        f_h, f_w = f.split((h, w), dim=2)
        g_h = torch.sigmoid(self.conv_h(f_h))  # (B, C, H, 1): eq. 7
        g_w = torch.sigmoid(self.conv_w(f_w)).transpose(2, 3)  # (B, C, 1, W): eq. 8
        return g_h, g_w

    def gate(self, x: Tensor) -> Tensor:
        """The total factor g^h ⊗ g^w, broadcast to (B, C, H, W)."""
        g_h, g_w = self.gates(x)
        return g_h * g_w

    def forward(self, x: Tensor) -> Tensor:
        g_h, g_w = self.gates(x)
        return x * g_h * g_w  # eq. 9


def make_attention(kind: ChannelAttentionKind, channels: int, reduction: int = 16) -> nn.Module:
    """The module named by ``kind`` for ``channels`` feature maps (``none``: identity)."""
    if kind == "none":
        return nn.Identity()
    if kind == "se":
        return SqueezeExcite(channels, reduction)
    if kind == "eca":
        return ECA(channels)
    if kind == "cbam":
        return CBAM(channels, reduction)
    if kind == "ca":
        return CoordinateAttention(channels, reduction)
    raise ValueError(f"attention must be one of none, se, eca, cbam, ca; got {kind!r}")
