"""Batching: seeded shuffled batches, and length buckets so batches carry little padding.

A batch is padded to a multiple of :data:`PAD_MULTIPLE` tokens (at most the data's longest
sequence), so a run meets a dozen tensor shapes, not one per length. Each new shape costs memory
that outlives the step: oneDNN compiles and caches kernels per shape (bf16 matmuls on CPU),
and the allocator keeps differently-sized freed blocks it cannot reuse. With exact lengths the
classifier's resident memory grew all through training (docs/results/peak_memory.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from attnlab.errors import UserError

PAD_MULTIPLE = 16  # batches are padded to a multiple of this many tokens


def bucket_length(n: int, longest: int, multiple: int = PAD_MULTIPLE) -> int:
    """The padded length of a batch whose longest row has ``n`` tokens: ``n`` rounded up to a
    multiple of ``multiple``, but not past ``longest`` (the data's longest row) unless n is."""
    if n < 1 or multiple < 1:
        raise ValueError(f"need n >= 1 and multiple >= 1, got n={n}, multiple={multiple}")
    return max(n, min(-(-n // multiple) * multiple, longest))


class LengthBucketSampler:
    """Deterministic per-epoch batches of example indices, grouped by length.

    Each epoch: shuffle all indices, cut them into pools, sort each pool by length, cut each pool
    into batches, then shuffle the batch order. Batches are therefore nearly uniform in length
    yet differ from epoch to epoch; `batches(epoch)` depends only on (seed, epoch).

    `batch_size` caps the examples of a batch (pools of `batch_size * bucket_mult`),
    `max_tokens` its padded tokens (rows * longest row <= max_tokens; without `batch_size`, pools
    of about `bucket_mult` batches at the mean length); give one or both, and with both a batch
    ends at whichever it reaches first. With `shuffle=False` nothing is shuffled: pools are
    consecutive indices and batches keep their sorted order (for evaluation).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        bucket_mult: int = 50,
        drop_last: bool = False,
        *,
        max_tokens: int | None = None,
    ) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.ndim != 1 or len(self.lengths) == 0:
            raise UserError("lengths must be a non-empty list of sequence lengths")
        if (self.lengths < 1).any():
            first = int(np.flatnonzero(self.lengths < 1)[0])
            raise UserError(
                f"example {first} has length {self.lengths[first]}; drop empty sequences first"
            )
        if batch_size is None and max_tokens is None:
            raise UserError("give batch_size, max_tokens or both")
        if bucket_mult < 1:
            raise UserError(f"bucket_mult must be >= 1, got {bucket_mult}")
        if seed < 0:
            raise UserError(f"seed must be >= 0, got {seed}")
        if batch_size is not None and batch_size < 1:
            raise UserError(f"batch_size must be >= 1, got {batch_size}")
        if max_tokens is not None:
            longest = int(self.lengths.max())
            if max_tokens < longest:
                raise UserError(
                    f"max_tokens={max_tokens} is below the longest sequence ({longest} tokens, "
                    f"example {int(self.lengths.argmax())}); raise max_tokens or truncate"
                )
            if drop_last:
                raise UserError("drop_last applies only with batch_size, not max_tokens")
        if batch_size is not None:
            pool_size = batch_size * bucket_mult
        else:
            assert max_tokens is not None
            pool_size = bucket_mult * max(1, max_tokens // math.ceil(self.lengths.mean()))
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.pool_size = pool_size

    def batches(self, epoch: int) -> list[list[int]]:
        """The batches (lists of example indices) for `epoch`, the same every time it is asked."""
        if epoch < 0:
            raise UserError(f"epoch must be >= 0, got {epoch}")
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.lengths)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        batches: list[list[int]] = []
        for start in range(0, n, self.pool_size):
            pool = order[start : start + self.pool_size]
            pool = pool[np.argsort(self.lengths[pool], kind="stable")]
            batches.extend(self._cut(pool))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _cut(self, pool: np.ndarray) -> list[list[int]]:
        """Cut a length-sorted pool into batches by count, padded-token budget, or both."""
        if self.max_tokens is None:
            size = self.batch_size
            assert size is not None
            cut = [pool[i : i + size].tolist() for i in range(0, len(pool), size)]
            return [b for b in cut if len(b) == size] if self.drop_last else cut
        rows = self.batch_size or len(pool)
        cut, current = [], []
        for index in pool.tolist():
            # the pool is sorted ascending, so the newcomer is the batch's longest row
            full = len(current) == rows
            if current and (full or (len(current) + 1) * self.lengths[index] > self.max_tokens):
                cut.append(current)
                current = []
            current.append(index)
        cut.append(current)
        return cut


def padding_fraction(
    batches: Sequence[Sequence[int]], lengths: Sequence[int], multiple: int = 1
) -> float:
    """Share of the padded (rows x padded length) token grid that is padding, over all batches;
    the padded length is the batch's longest row rounded as :func:`bucket_length` does."""
    lengths_array = np.asarray(lengths, dtype=np.int64)
    longest = int(lengths_array.max())
    real = padded = 0
    for batch in batches:
        if len(batch) == 0:
            raise UserError("empty batch")
        batch_lengths = lengths_array[list(batch)]
        real += int(batch_lengths.sum())
        padded += len(batch) * bucket_length(int(batch_lengths.max()), longest, multiple)
    if padded == 0:
        raise UserError("no tokens in the batches")
    return 1.0 - real / padded


def pad_batch(
    seqs: Sequence[Sequence[int]], pad_id: int = 0, length: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into `input_ids` (B, T) long and their `lengths` (B,) long; T is the
    longest row, or `length` when that is longer."""
    if len(seqs) == 0:
        raise UserError("cannot pad an empty batch")
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    if (lengths == 0).any():
        # an all-padding row would make every attention score masked, giving NaN
        raise UserError(f"sequence {int((lengths == 0).nonzero()[0])} is empty; drop it first")
    T = max(int(lengths.max()), length)
    input_ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    for row, seq in enumerate(seqs):
        input_ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return input_ids, lengths


def shuffled_batches(
    n: int, batch_size: int, seed: int, epoch: int, drop_last: bool = False
) -> list[list[int]]:
    """Split a permutation of range(n) seeded by (seed, epoch) into batches of `batch_size`."""
    if n < 1 or batch_size < 1:
        raise UserError(f"need n >= 1 and batch_size >= 1, got n={n}, batch_size={batch_size}")
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(n, generator=gen).tolist()
    stop = n - n % batch_size if drop_last else n
    return [order[i : i + batch_size] for i in range(0, stop, batch_size)]
