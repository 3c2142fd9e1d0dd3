"""Choosing a maximum sequence length and reporting what truncation to it costs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnlab.errors import UserError


def choose_max_len(lengths: Sequence[int], percentile: float = 95, cap: int | None = None) -> int:
    """Smallest length covering `percentile` % of the texts entirely, at most `cap`.

    Pass the full encoded lengths (len(text), plus 1 if a `<cls>` will be added).
    """
    if len(lengths) == 0:
        raise UserError("no lengths given; choose_max_len needs the training texts' lengths")
    if not 0 < percentile <= 100:
        raise UserError(f"percentile must be in (0, 100], got {percentile}")
    if cap is not None and cap < 1:
        raise UserError(f"cap must be >= 1, got {cap}")
    chosen = max(1, math.ceil(float(np.percentile(lengths, percentile, method="inverted_cdf"))))
    return chosen if cap is None else min(chosen, cap)


@dataclass(frozen=True)
class TruncationReport:
    """How many texts and tokens a `max_len` cuts off."""

    max_len: int
    num_texts: int
    num_truncated: int
    tokens_total: int
    tokens_dropped: int

    @property
    def fraction_truncated(self) -> float:
        """Share of texts that lose at least one token."""
        return self.num_truncated / self.num_texts

    @property
    def fraction_tokens_dropped(self) -> float:
        """Share of all tokens cut off."""
        return self.tokens_dropped / self.tokens_total if self.tokens_total else 0.0

    def __str__(self) -> str:
        return (
            f"max_len {self.max_len}: {self.num_truncated}/{self.num_texts} texts truncated "
            f"({self.fraction_truncated:.1%}), {self.tokens_dropped}/{self.tokens_total} tokens "
            f"dropped ({self.fraction_tokens_dropped:.1%})"
        )


def truncation_report(lengths: Sequence[int], max_len: int) -> TruncationReport:
    """Count the texts longer than `max_len` and the tokens truncation drops."""
    if len(lengths) == 0:
        raise UserError("no lengths given")
    if max_len < 1:
        raise UserError(f"max_len must be >= 1, got {max_len}")
    array = np.asarray(lengths, dtype=np.int64)
    return TruncationReport(
        max_len=max_len,
        num_texts=len(array),
        num_truncated=int((array > max_len).sum()),
        tokens_total=int(array.sum()),
        tokens_dropped=int(np.clip(array - max_len, 0, None).sum()),
    )
