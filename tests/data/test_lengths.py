"""Tests for max-length choice and truncation reporting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.data.lengths import choose_max_len, truncation_report


def test_choose_max_len_covers_the_percentile() -> None:
    lengths = list(range(1, 101))  # 1..100
    assert choose_max_len(lengths, 95) == 95
    assert choose_max_len(lengths, 100) == 100
    assert choose_max_len(lengths, 95, cap=64) == 64
    assert choose_max_len([7], 50) == 7
    with pytest.raises(ValueError):
        choose_max_len([], 95)
    with pytest.raises(ValueError):
        choose_max_len([3], 0)


def test_truncation_report_counts_texts_and_tokens() -> None:
    report = truncation_report([3, 10, 12, 5], max_len=8)
    assert (report.num_texts, report.num_truncated) == (4, 2)
    assert (report.tokens_total, report.tokens_dropped) == (30, 6)
    assert report.fraction_truncated == 0.5
    assert report.fraction_tokens_dropped == pytest.approx(0.2)
    assert "2/4 texts truncated" in str(report)


@settings(deadline=None)  # hypothesis' 200 ms deadline fails on a loaded machine
@given(st.lists(st.integers(1, 500), min_size=1, max_size=200), st.floats(1, 100))
def test_choose_max_len_is_the_smallest_covering_length(lengths: list[int], pct: float) -> None:
    chosen = choose_max_len(lengths, pct)
    covered = sum(n <= chosen for n in lengths) / len(lengths)
    assert covered >= pct / 100 - 1e-9
    assert sum(n <= chosen - 1 for n in lengths) / len(lengths) < pct / 100
