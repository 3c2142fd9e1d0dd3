"""MAE (attnlab/models/mae.py) against Hugging Face ``ViTMAEForPreTraining`` with the same
noise, through ``attnlab verify``'s check (float64: mask, encoder output, decoder predictions,
loss with and without normalised targets, every gradient, to 1e-10); masking and patch layout
against their definitions; the check fails when the restore order is dropped."""

from __future__ import annotations

import pytest
import torch

from attnlab.models import mae as mae_mod
from attnlab.models.mae import MAE, MAEConfig, patchify, random_masking, unpatchify
from attnlab.verify.check import Measure
from attnlab.verify.checks_vision import check_mae

pytest.importorskip("transformers")


def test_mae_matches_hugging_face_with_the_same_noise() -> None:
    m = Measure()
    check_mae(m)
    assert m.cases == 3 and not m.failures and m.error < 1e-10, (m.error, m.failures)


def test_the_check_fails_if_the_decoder_forgets_to_unshuffle(monkeypatch) -> None:
    real = mae_mod.random_masking

    def no_restore(n, ratio, noise):
        keep, mask, restore = real(n, ratio, noise)
        return keep, mask, torch.arange(n).expand_as(restore)

    monkeypatch.setattr(mae_mod, "random_masking", no_restore)
    m = Measure()
    # (Counted by hand.) A case misses the break when every image keeps patches 0..k-1 in
    # noise order (then no token moves): 1/4 per image for 4 patches keeping 1, ~2.4% per case
    # over the drawn shapes, so 3 cases would pass by chance about once in 70,000 seeds; 6
    # cases: 2e-10.
    check_mae(m, cases=6)
    assert m.error > 1e-3


def test_masking_keeps_the_lowest_noise_and_patches_round_trip() -> None:
    noise = torch.tensor([[0.9, 0.1, 0.5, 0.3]])
    keep, mask, restore = random_masking(4, 0.5, noise)
    assert keep.tolist() == [[1, 3]] and mask.tolist() == [[1, 0, 1, 0]]
    x = torch.randn(2, 3, 8, 8)
    p = patchify(x, 4)
    assert p.shape == (2, 4, 48)
    torch.testing.assert_close(p[0, 1, :3], x[0, :, 0, 4])  # patch (0, 1), pixel (0, 0), RGB
    torch.testing.assert_close(unpatchify(p, 4, 3), x)


def test_mae_trains_and_its_encoder_is_a_vit() -> None:
    model = MAE(MAEConfig(image_size=8, patch_size=2, d_model=8, n_heads=2, decoder_d_model=8))
    out = model(torch.randn(2, 1, 8, 8))
    assert out["mask"].sum(1).tolist() == [12.0, 12.0]  # 75% of 16 patches hidden
    assert out["latent"].shape == (2, 1 + 4, 8)
    out["loss"].backward()
    assert model.decoder_pred.weight.grad is not None
    rec = model.reconstruct(torch.randn(1, 1, 8, 8))
    assert rec["reconstruction"].shape == (1, 1, 8, 8)
