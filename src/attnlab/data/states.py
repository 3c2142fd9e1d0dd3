"""Hidden states of a frozen encoder's lower blocks, kept once and batched like token ids.

When the embeddings and the lowest blocks of a pretrained encoder do not train, their output
for a text never changes: computing it once and training the blocks above on it gives the same
gradients as running the whole encoder every step (the frozen part in eval mode, so without
dropout) at a fraction of the cost. :class:`StateData` holds those outputs, one (T_i, D) fp16
tensor a text without padding, and follows the batching contract of
:class:`~attnlab.data.classification.ClassificationData` (``batches(epoch)``, ``collate``,
``labels``), so the engine and the evaluation loops take either.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlab.data.buckets import PAD_MULTIPLE, LengthBucketSampler, bucket_length
from attnlab.errors import UserError

# fp16 keeps 11 significant bits (bf16 8) over the range these post-norm states span
STORE_DTYPE = torch.float16


class StateData:
    """Cached hidden states (each (T_i, D)) of the blocks below ``start``, with integer labels.

    ``collate`` returns ``hidden`` (B, T, D) float32 zero-padded, ``lengths`` (B,), ``labels``
    (B,) and ``start``, the first block still to run: a model's ``forward(None, lengths,
    hidden=hidden, start=start)`` continues from there.
    """

    def __init__(
        self,
        states: Sequence[torch.Tensor],
        labels: Sequence[int],
        sampler: LengthBucketSampler,
        start: int,
        pad_multiple: int = PAD_MULTIPLE,
    ) -> None:
        if len(states) != len(labels):
            raise UserError(f"{len(states)} cached states but {len(labels)} labels")
        lengths = [int(s.shape[0]) for s in states]
        if sampler.lengths.tolist() != lengths:
            raise UserError("the sampler was built for other sequence lengths than these")
        self.states = [s.to(STORE_DTYPE) for s in states]
        self.labels = list(labels)
        self.sampler = sampler
        self.start = start
        self.pad_multiple = pad_multiple
        self.longest = max(lengths, default=1)

    def __len__(self) -> int:
        return len(self.states)

    def nbytes(self) -> int:
        """Memory the cached states take."""
        return sum(s.numel() * s.element_size() for s in self.states)

    @staticmethod
    def num_tokens(batch: dict) -> int:
        """Non-padding tokens in a collated batch (for tokens/second reporting)."""
        return int(batch["lengths"].sum())

    def batches(self, epoch: int) -> list[list[int]]:
        """Example indices of each batch of ``epoch`` (deterministic given the sampler's seed)."""
        return self.sampler.batches(epoch)

    def collate(self, indices: Sequence[int]) -> dict:
        """``hidden`` (B, T, D) float32, ``lengths`` (B,), ``labels`` (B,) and ``start``; T is
        the longest row rounded up as token batches are (:func:`bucket_length`)."""
        rows = [self.states[i] for i in indices]
        T = bucket_length(max(r.shape[0] for r in rows), self.longest, self.pad_multiple)
        hidden = torch.zeros(len(rows), T, rows[0].shape[1])  # (B, T, D)
        for b, row in enumerate(rows):
            hidden[b, : row.shape[0]] = row.float()
        return {
            "hidden": hidden,
            "lengths": torch.tensor([r.shape[0] for r in rows], dtype=torch.long),
            "labels": torch.tensor([self.labels[i] for i in indices], dtype=torch.long),
            "start": self.start,
        }
