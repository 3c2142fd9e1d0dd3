"""Swin (attnlab/models/swin.py) against Hugging Face ``SwinForImageClassification`` and the
paper's definitions.

* parity through ``attnlab verify``'s checks: float64 (HF's sdpa path) stage outputs, final
  states, pooled output and logits to 1e-10; float32 eager with attention weights to 5e-5;
  four shapes: shifted and unshifted windows, padding of grids not divisible by the window,
  one window clamped to the grid, three stages;
* the check is able to fail: without the shifted-window mask, or with the bias table read at
  the opposite offsets, it does;
* window partition and its inverse; the shifted mask against a brute-force reading of §3.2
  (two tokens of a rolled window may attend iff they were in the same region before rolling).
"""

from __future__ import annotations

import pytest
import torch

from attnlab.models import swin as swin_mod
from attnlab.models.swin import (
    Swin,
    SwinConfig,
    shifted_window_mask,
    window_partition,
    window_reverse,
)
from attnlab.verify.check import Measure
from attnlab.verify.checks_vision import check_swin

pytest.importorskip("transformers")


def run(f64: bool = True) -> Measure:
    m = Measure()
    check_swin(m, f64)
    return m


def test_swin_matches_hugging_face_in_float64() -> None:
    m = run()
    assert m.cases == 4 and not m.failures and m.error < 1e-10, (m.error, m.failures)


def test_swin_attention_weights_match_hugging_face_in_float32() -> None:
    m = run(f64=False)
    assert m.cases == 4 and not m.failures and m.error < 5e-5, (m.error, m.failures)


def test_the_parity_check_fails_without_the_shift_mask(monkeypatch) -> None:
    def no_mask(h, w, window, shift):
        return torch.ones_like(shifted_window_mask(h, w, window, shift))

    monkeypatch.setattr(swin_mod, "shifted_window_mask", no_mask)
    assert run().error > 1e-3


def test_the_parity_check_fails_with_the_offsets_of_the_bias_table_reversed(monkeypatch) -> None:
    index = swin_mod.relative_position_index
    monkeypatch.setattr(swin_mod, "relative_position_index", lambda window: index(window).T)
    assert run().error > 1e-3


def test_window_partition_round_trip_and_order() -> None:
    x = torch.arange(2 * 6 * 6 * 3.0).view(2, 6, 6, 3)
    w = window_partition(x, 3)  # (2·4, 9, 3)
    assert w.shape == (8, 9, 3)
    assert torch.equal(w[1, 0], x[0, 0, 3])  # second window of image 0 starts at column 3
    assert torch.equal(window_reverse(w, 3, 6, 6), x)


@pytest.mark.parametrize("size, window, shift", [(8, 4, 2), (6, 3, 1), (12, 4, 2)])
def test_shifted_mask_is_same_region_before_rolling(size: int, window: int, shift: int) -> None:
    # Label every token of the unrolled grid by the roll-wrapped block it belongs to: after
    # rolling by -shift, a window may only mix tokens that were adjacent in the original image.
    rows, cols = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    rolled_r = torch.roll(rows, (-shift, -shift), (0, 1))
    rolled_c = torch.roll(cols, (-shift, -shift), (0, 1))
    coords = torch.stack([rolled_r, rolled_c], -1)[None].float()  # (1, S, S, 2) original coords
    win = window_partition(coords, window)  # (nW, M², 2)
    dist = (win[:, :, None] - win[:, None, :]).abs().amax(-1)  # Chebyshev distance before roll
    want = dist < window  # neighbours in the original grid, not wrapped around
    assert torch.equal(shifted_window_mask(size, size, window, shift), want)


def test_swin_trains_one_step_and_clamps_windows() -> None:
    cfg = SwinConfig(image_size=28, patch_size=2, d_model=12, depths=(2, 2), stage_heads=(2, 4))
    model = Swin(cfg)
    geometry = model.inspect(torch.randn(1, 1, 28, 28))["windows"]
    assert [g["shift"] for g in geometry] == [0, 3, 0, 0]  # 7x7 stage: one window, no shift
    loss = torch.nn.functional.cross_entropy(
        model(torch.randn(3, 1, 28, 28)), torch.tensor([0, 1, 2])
    )
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
