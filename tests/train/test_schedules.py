"""lr schedules against values computed by hand."""

from __future__ import annotations

import pytest

from attnlab.train.schedules import lr_factor, resolve_warmup


def f(step: int, schedule: str, **kw) -> float:
    args = {"total_steps": 10, "warmup_steps": 2, "min_lr_ratio": 0.1} | kw
    return lr_factor(step, schedule=schedule, **args)


@pytest.mark.parametrize(
    "schedule,step,expected",
    [
        # warmup is shared: step/warmup
        ("cosine", 1, 0.5),
        ("linear", 1, 0.5),
        ("constant", 1, 0.5),
        ("cosine", 2, 1.0),
        ("linear", 2, 1.0),
        ("constant", 2, 1.0),
        # p = (step-2)/8; cosine 0.1 + 0.9*(1+cos(pi p))/2 ; linear 0.1 + 0.9*(1-p)
        ("cosine", 4, 0.8681980515339464),  # p=1/4: 0.1 + 0.45*(1 + 0.70710678)
        ("cosine", 6, 0.55),  # p=1/2
        ("cosine", 10, 0.1),  # last step runs at min_lr_ratio
        ("cosine", 50, 0.1),  # past the end stays at the floor
        ("linear", 4, 0.775),
        ("linear", 6, 0.55),
        ("linear", 10, 0.1),
        ("constant", 10, 1.0),
    ],
)
def test_warmup_then_decay(schedule: str, step: int, expected: float) -> None:
    assert f(step, schedule) == pytest.approx(expected, abs=1e-12)


def test_no_warmup_starts_at_peak() -> None:
    assert f(1, "cosine", warmup_steps=0, min_lr_ratio=0.0) == pytest.approx(
        0.5 * (1 + 0.9510565162951535)  # p = 1/10, cos(pi/10)
    )


def test_noam_paper_formula() -> None:
    # Vaswani et al. 2017 eq. 3 with d_model=512, warmup=4000
    kw = {"total_steps": 100_000, "warmup_steps": 4000, "noam_d_model": 512}
    assert f(1, "noam", **kw) == pytest.approx(1.746928107421711e-07, rel=1e-12)
    assert f(4000, "noam", **kw) == pytest.approx(6.987712429686843e-04, rel=1e-12)
    assert f(16000, "noam", **kw) == pytest.approx(3.4938562148434214e-04, rel=1e-12)


def test_noam_normalised_peak_is_lr() -> None:
    kw = {"total_steps": 100, "warmup_steps": 4, "noam_d_model": 0}
    assert f(2, "noam", **kw) == pytest.approx(0.5)  # linear rise step/warmup
    assert f(4, "noam", **kw) == pytest.approx(1.0)  # peak
    assert f(16, "noam", **kw) == pytest.approx(0.5)  # (warmup/step)^0.5 = (4/16)^0.5
    assert max(f(s, "noam", **kw) for s in range(1, 100)) == pytest.approx(1.0)


def test_resolve_warmup() -> None:
    assert resolve_warmup(7, 0.5, 100) == 7
    assert resolve_warmup(0, 0.1, 95) == 10  # round(9.5) -> banker's rounding to 10
    assert resolve_warmup(0, 0.0, 95) == 0


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="1-based"):
        f(0, "cosine")
    with pytest.raises(ValueError, match="unknown schedule"):
        f(1, "step")
    with pytest.raises(ValueError, match="warmup"):
        f(1, "noam", warmup_steps=0)


@pytest.mark.parametrize(
    "step,expected",
    [
        (1, 0.5),  # warmup 1/2
        (2, 1.0),
        (5, 1.0),  # stable
        (6, 1.0),  # total 10, decay_ratio 0.4: the last 4 steps (7..10) decay
        (7, 0.775),  # q = 1/4: 0.1 + 0.9 * 3/4
        (8, 0.55),
        (9, 0.325),
        (10, 0.1),  # last step runs at min_lr_ratio
        (12, 0.1),
    ],
)
def test_wsd_warmup_stable_decay(step: int, expected: float) -> None:
    assert f(step, "wsd", decay_ratio=0.4) == pytest.approx(expected, abs=1e-12)


def test_wsd_edges() -> None:
    # decay_ratio 0: warmup then constant; decay_ratio 1: the decay starts after the warmup
    assert [f(s, "wsd", decay_ratio=0.0) for s in (2, 9, 10)] == [1.0, 1.0, 1.0]
    assert f(4, "wsd", decay_ratio=1.0) == pytest.approx(f(4, "linear"), abs=1e-12)
    assert f(10, "wsd", decay_ratio=1.0) == pytest.approx(0.1, abs=1e-12)
    with pytest.raises(ValueError, match="decay_ratio"):
        f(5, "wsd", decay_ratio=1.5)
