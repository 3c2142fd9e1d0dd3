"""DeiT: the ViT with a distillation token (attnlab/models/vit.py :class:`DeiT`) against
Hugging Face ``DeiTForImageClassificationWithTeacher`` through ``attnlab verify``'s check
(float64: hidden states, both heads and their mean to 1e-10), and the config's rules."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import UserError
from attnlab.models.vit import DeiT, ViT, ViTConfig
from attnlab.verify.check import Measure
from attnlab.verify.checks_vision import check_deit

pytest.importorskip("transformers")


def test_deit_matches_hugging_face_in_float64() -> None:
    m = Measure()
    check_deit(m)
    assert m.cases == 3 and not m.failures and m.error < 1e-10, (m.error, m.failures)


def test_distillation_token_layout_and_rules() -> None:
    cfg = ViTConfig(image_size=8, patch_size=4, d_model=8, n_heads=2, n_layers=1, distill=True)
    model = DeiT(cfg).eval()
    assert cfg.n_tokens == 4 + 2 and model.pos_embed.embedding.weight.shape == (6, 8)
    x = torch.randn(2, 1, 8, 8)
    info = model.inspect(x)
    cls_logits, dist_logits = model.heads(info["last_hidden_state"])
    torch.testing.assert_close(model(x), (cls_logits + dist_logits) / 2)
    torch.testing.assert_close(dist_logits, model.head_dist(info["last_hidden_state"][:, 1]))
    with pytest.raises(ValueError, match="distill=true \\(DeiT\\) needs pooling='cls'"):
        ViTConfig(distill=True, pooling="mean").validate()


def test_each_class_refuses_the_others_distill_setting() -> None:
    shape = {"image_size": 8, "patch_size": 4, "d_model": 8, "n_heads": 2, "n_layers": 1}
    with pytest.raises(UserError, match="distill = true adds DeiT's distillation token"):
        ViT(ViTConfig(**shape, distill=True))
    with pytest.raises(UserError, match="--arch deit trains a ViT with distill = true"):
        DeiT(ViTConfig(**shape))
    assert not hasattr(ViT(ViTConfig(**shape)), "dist_token")
