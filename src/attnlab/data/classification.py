"""`ClassificationData`: the batches/collate protocol the training engine consumes."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlab.data.buckets import PAD_MULTIPLE, LengthBucketSampler, bucket_length, pad_batch
from attnlab.data.char_tokenizer import PAD_ID, CharTokenizer
from attnlab.data.labels import LabelVocab
from attnlab.errors import UserError


class ClassificationData:
    """Encoded sequences with integer labels, batched by a `LengthBucketSampler`.

    The engine calls `batches(epoch)` for lists of example indices and `collate(indices)` for the
    tensors of one batch.
    """

    def __init__(
        self,
        sequences: Sequence[Sequence[int]],
        labels: Sequence[int],
        sampler: LengthBucketSampler,
        pad_id: int = PAD_ID,
        pad_multiple: int = PAD_MULTIPLE,
    ) -> None:
        if len(sequences) != len(labels):
            raise UserError(f"{len(sequences)} sequences but {len(labels)} labels")
        lengths = [len(s) for s in sequences]
        if sampler.lengths.tolist() != lengths:
            raise UserError("the sampler was built for other sequence lengths than these")
        self.sequences = [list(s) for s in sequences]
        self.labels = list(labels)
        self.sampler = sampler
        self.pad_id = pad_id
        self.pad_multiple = pad_multiple
        self.longest = max(lengths, default=1)

    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        labels: Sequence[str],
        tokenizer: CharTokenizer,
        label_vocab: LabelVocab,
        *,
        max_len: int,
        add_cls: bool,
        batch_size: int,
        shuffle: bool,
        seed: int = 0,
        tail_share: float = 0.0,
    ) -> ClassificationData:
        """Encode texts (head, or head and tail, kept on truncation) and labels; bucket them."""
        sequences = [tokenizer.encode(t, max_len, add_cls, tail_share) for t in texts]
        sampler = LengthBucketSampler(
            [len(s) for s in sequences], batch_size, shuffle=shuffle, seed=seed
        )
        return cls(sequences, label_vocab.encode(labels), sampler)

    def __len__(self) -> int:
        return len(self.sequences)

    def batches(self, epoch: int) -> list[list[int]]:
        """Example indices of each batch of `epoch` (deterministic given the sampler's seed)."""
        return self.sampler.batches(epoch)

    def collate(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """`input_ids` (B, T), `lengths` (B,) and `labels` (B,), all long, for these examples;
        T is the longest row rounded up by :func:`bucket_length` (a few shapes per run)."""
        seqs = [self.sequences[i] for i in indices]
        T = bucket_length(max(len(s) for s in seqs), self.longest, self.pad_multiple)
        input_ids, lengths = pad_batch(seqs, self.pad_id, T)
        labels = torch.tensor([self.labels[i] for i in indices], dtype=torch.long)
        return {"input_ids": input_ids, "lengths": lengths, "labels": labels}

    @staticmethod
    def num_tokens(batch: dict[str, torch.Tensor]) -> int:
        """Non-padding tokens in a collated batch (for tokens/second reporting)."""
        return int(batch["lengths"].sum())
