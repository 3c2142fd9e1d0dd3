"""The share of <unk> tokens in an input and the out-of-reach flag (data/coverage.py)."""

from __future__ import annotations

import pytest

from attnlab.data.coverage import UNKNOWN_SHARE_LIMIT, reach, unknown_share


def test_share_counts_text_tokens_only():
    assert unknown_share([2, 1, 5, 1, 7], unk_id=1, specials={2}) == pytest.approx(0.5)
    assert unknown_share([2, 1, 1, 3], unk_id=1, specials={2, 3}) == 1.0
    assert unknown_share([2, 3], unk_id=1, specials={2, 3}) == 0.0  # nothing but specials


def test_flag_and_warning_only_above_the_limit():
    n = 10
    at_limit = [1] * round(UNKNOWN_SHARE_LIMIT * n) + [5] * (n - round(UNKNOWN_SHARE_LIMIT * n))
    fields = reach(at_limit, unk_id=1)
    assert fields["unknown_share"] == pytest.approx(UNKNOWN_SHARE_LIMIT)
    assert fields["out_of_reach"] is False and "warning" not in fields
    over = reach([1] * 4 + [5] * 6, unk_id=1, unit="word pieces")
    assert over["out_of_reach"] is True
    assert over["warning"].startswith("40% of its word pieces were never")
