"""Tests for length-bucketed batching, padding accounting and batch padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.data.buckets import (
    LengthBucketSampler,
    pad_batch,
    padding_fraction,
    shuffled_batches,
)


def _review_like_lengths(n: int = 3000, seed: int = 0) -> list[int]:
    """Skewed lengths like the review corpus (median ~50, long tail)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(3.9, 0.9, n).astype(int), 1, 400).tolist()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 60), min_size=1, max_size=200),
    st.integers(1, 17),
    st.integers(1, 5),
    st.integers(0, 3),
)
def test_every_index_once_per_epoch(lengths: list[int], batch_size: int, mult: int, epoch: int):
    sampler = LengthBucketSampler(lengths, batch_size, seed=3, bucket_mult=mult)
    batches = sampler.batches(epoch)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(1 <= len(b) <= batch_size for b in batches)
    assert sum(len(b) < batch_size for b in batches) <= 1  # only the last pool's tail
    assert batches == sampler.batches(epoch)


def test_drop_last_keeps_only_full_batches() -> None:
    sampler = LengthBucketSampler([5] * 103, 10, drop_last=True, bucket_mult=2)
    batches = sampler.batches(0)
    assert len(batches) == 10 and all(len(b) == 10 for b in batches)
    assert len({i for b in batches for i in b}) == 100


def test_deterministic_per_epoch_and_different_across_epochs() -> None:
    lengths = _review_like_lengths(500)
    a = LengthBucketSampler(lengths, 16, seed=7, bucket_mult=4)
    b = LengthBucketSampler(lengths, 16, seed=7, bucket_mult=4)
    assert a.batches(2) == b.batches(2)
    assert a.batches(0) != a.batches(1)
    assert LengthBucketSampler(lengths, 16, seed=8, bucket_mult=4).batches(2) != a.batches(2)


def test_bucketing_cuts_padding_compared_with_random_batches() -> None:
    lengths = _review_like_lengths()
    bucketed = LengthBucketSampler(lengths, 32, seed=0).batches(0)
    order = np.random.default_rng(0).permutation(len(lengths))
    random_batches = [order[i : i + 32].tolist() for i in range(0, len(order), 32)]
    bucketed_pad = padding_fraction(bucketed, lengths)
    random_pad = padding_fraction(random_batches, lengths)
    assert random_pad > 0.4
    assert bucketed_pad < 0.1 * random_pad


def test_padding_fraction_exact() -> None:
    # batch [0,1]: 2 rows x 4 = 8 slots, 6 real; batch [2]: 1 slot, 1 real
    assert padding_fraction([[0, 1], [2]], [2, 4, 1]) == pytest.approx(1 - 7 / 9)
    with pytest.raises(ValueError):
        padding_fraction([[]], [1])


def test_no_shuffle_sorts_each_pool_and_ignores_epoch() -> None:
    lengths = [5, 1, 4, 2, 3, 9]
    sampler = LengthBucketSampler(lengths, 2, shuffle=False, bucket_mult=2)  # pools of 4
    assert sampler.batches(0) == [[1, 3], [2, 0], [4, 5]]
    assert sampler.batches(5) == sampler.batches(0)


def test_token_budget_mode() -> None:
    lengths = _review_like_lengths(1000)
    sampler = LengthBucketSampler(lengths, max_tokens=1024, seed=1)
    batches = sampler.batches(0)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    grids = [len(b) * max(lengths[i] for i in b) for b in batches]
    assert max(grids) <= 1024
    assert sum(grids) / len(grids) > 0.75 * 1024  # batches are filled, not one row each
    assert batches == LengthBucketSampler(lengths, max_tokens=1024, seed=1).batches(0)


def test_rows_and_token_budget_together() -> None:
    # short rows fill a batch up to batch_size; long rows stop at the token budget first
    lengths = [3] * 10 + [40] * 6
    sampler = LengthBucketSampler(lengths, 4, shuffle=False, max_tokens=100)
    batches = sampler.batches(0)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert [len(b) for b in batches] == [4, 4, 2, 2, 2, 2]
    assert all(len(b) * max(lengths[i] for i in b) <= 100 for b in batches)
    assert LengthBucketSampler(lengths, 4, shuffle=False).batches(0) != batches


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "batch_size, max_tokens or both"),
        ({"batch_size": 4, "max_tokens": 5}, "longest sequence"),
        ({"batch_size": 4, "max_tokens": 100, "drop_last": True}, "drop_last"),
        ({"max_tokens": 5}, "longest sequence"),
        ({"max_tokens": 100, "drop_last": True}, "drop_last"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_sampler_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LengthBucketSampler([3, 8], **kwargs)


def test_zero_length_sequences_are_rejected() -> None:
    with pytest.raises(ValueError, match="example 1 has length 0"):
        LengthBucketSampler([3, 0], 2)


def test_pad_batch() -> None:
    ids, lengths = pad_batch([[5, 6, 7], [8]], pad_id=0)
    assert ids.dtype == torch.long and lengths.dtype == torch.long
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert lengths.tolist() == [3, 1]
    assert pad_batch([[4]], pad_id=9)[0].tolist() == [[4]]
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        pad_batch([[1], []])
    with pytest.raises(ValueError):
        pad_batch([])


def test_batch_order_is_shuffled_not_short_to_long() -> None:
    lengths = _review_like_lengths(640)
    batches = LengthBucketSampler(lengths, 32, seed=0, bucket_mult=100).batches(0)  # one pool
    longest = [max(lengths[i] for i in b) for b in batches]
    assert longest != sorted(longest)
    unshuffled = LengthBucketSampler(lengths, 32, shuffle=False, bucket_mult=100).batches(0)
    assert [max(lengths[i] for i in b) for b in unshuffled] == sorted(longest)


def test_shuffled_batches_partition_and_depend_only_on_seed_and_epoch() -> None:
    batches = shuffled_batches(23, 5, seed=3, epoch=1)
    assert [len(b) for b in batches] == [5, 5, 5, 5, 3]
    assert sorted(i for b in batches for i in b) == list(range(23))
    assert shuffled_batches(23, 5, seed=3, epoch=1) == batches
    assert shuffled_batches(23, 5, seed=3, epoch=2) != batches
    assert shuffled_batches(23, 5, seed=4, epoch=1) != batches
    assert [len(b) for b in shuffled_batches(23, 5, 3, 1, drop_last=True)] == [5, 5, 5, 5]
    with pytest.raises(ValueError, match="batch_size >= 1"):
        shuffled_batches(23, 0, 3, 1)
