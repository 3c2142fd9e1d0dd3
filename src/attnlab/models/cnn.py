"""A small ResNet (He et al. 2016) whose residual blocks take any channel/spatial attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.configs import ConfigBase, setting
from attnlab.layers.channel import ChannelAttentionKind, make_attention
from attnlab.models.registry import images, register_model


@dataclass
class CNNConfig(ConfigBase):
    """Stages of residual blocks; each later stage halves the resolution and doubles width."""

    in_channels: int = setting(1, min=1)
    width: int = setting(32, min=1)
    stages: int = setting(3, min=1)
    blocks_per_stage: int = setting(2, min=1)
    channel_attention: ChannelAttentionKind = setting(
        "none", "channel/spatial attention module in every block"
    )
    reduction: int = setting(16, min=1)
    dropout: float = setting(0.0, min=0.0, below=1.0)
    n_classes: int = setting(10, min=2)


class BasicBlock(nn.Module):
    """y = ReLU(A(BN(conv(ReLU(BN(conv(x)))))) + shortcut(x)); A is the attention module."""

    def __init__(
        self, c_in: int, c_out: int, stride: int, attention: ChannelAttentionKind, reduction: int
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.attention = make_attention(attention, c_out, reduction)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.bn1(self.conv1(x)))  # (B, C_out, H/s, W/s)
        h = self.attention(self.bn2(self.conv2(h)))
        return F.relu(h + self.shortcut(x))


class ResNetCNN(nn.Module):
    """Stem conv, ``stages`` × ``blocks_per_stage`` BasicBlocks, global average pool, linear."""

    def __init__(self, cfg: CNNConfig) -> None:
        super().__init__()
        cfg.validate(complete=True)
        self.cfg = cfg
        self.stem = nn.Sequential(
            nn.Conv2d(cfg.in_channels, cfg.width, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cfg.width),
            nn.ReLU(),
        )
        blocks, c = [], cfg.width
        for stage in range(cfg.stages):
            c_out = cfg.width * 2**stage
            for i in range(cfg.blocks_per_stage):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(c, c_out, stride, cfg.channel_attention, cfg.reduction))
                c = c_out
        self.blocks = nn.Sequential(*blocks)
        self.dropout = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(c, cfg.n_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and m.kernel_size != (1, 1) and m.out_channels > 1:
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> logits (B, n_classes)."""
        if images.dim() != 4 or images.shape[1] != self.cfg.in_channels:
            raise ValueError(
                f"images must have shape (B, {self.cfg.in_channels}, H, W), "
                f"got {tuple(images.shape)}"
            )
        h = self.blocks(self.stem(images))  # (B, C_last, H', W')
        return self.head(self.dropout(h.mean(dim=(2, 3))))


register_model(
    "cnn",
    family="cnn",
    config=CNNConfig,
    oracle=None,
    example=images,
    tiny={"width": 8, "stages": 2, "blocks_per_stage": 1, "reduction": 4},
    note="no oracle: tests/layers/test_channel.py checks each attention module by hand",
)(ResNetCNN)
