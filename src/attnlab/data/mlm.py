"""Masked-language-model inputs: BERT's 15% selection with the 80/10/10 replacement rule."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnlab.data.buckets import LengthBucketSampler, pad_batch
from attnlab.errors import UserError


def mask_tokens(
    input_ids: Tensor,
    lengths: Tensor,
    special_ids: Sequence[int],
    mask_id: int,
    vocab_size: int,
    mask_prob: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Choose MLM targets (Devlin et al. 2019, §3.1) in right-padded ids (B, T).

    Each real, non-special token is selected with probability ``mask_prob``; a selected token
    becomes [MASK] 80% of the time, a random non-special token 10%, and stays itself 10%.
    Returns (corrupted ids (B, T), selected (B, T) bool, original ids at the selected
    positions (N,)). At least one token of the batch is selected when any is selectable.
    """
    if not 0.0 < mask_prob < 1.0:
        raise UserError(f"mask_prob must be in (0, 1), got {mask_prob}")
    B, T = input_ids.shape
    real = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    candidate = real & ~torch.isin(input_ids, torch.tensor(list(special_ids)))
    draw = torch.rand(B, T, generator=generator)  # (B, T)
    selected = candidate & (draw < mask_prob)
    if not selected.any() and candidate.any():
        selected.view(-1)[candidate.view(-1).nonzero()[0]] = True
    action = torch.rand(B, T, generator=generator)  # (B, T): <0.8 mask, <0.9 random, else keep
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[list(special_ids)] = False
    normal = allowed.nonzero().squeeze(1)  # (V - specials,)
    random_ids = normal[torch.randint(len(normal), (B, T), generator=generator)]  # (B, T)
    corrupted = input_ids.clone()
    corrupted[selected & (action < 0.8)] = mask_id
    swap = selected & (action >= 0.8) & (action < 0.9)
    corrupted[swap] = random_ids[swap]
    return corrupted, selected, input_ids[selected]


class MLMData:
    """Token sequences for masked-LM training, batched by length; masks drawn at collate time."""

    def __init__(
        self,
        sequences: Sequence[Sequence[int]],
        sampler: LengthBucketSampler,
        *,
        pad_id: int,
        mask_id: int,
        special_ids: Sequence[int],
        vocab_size: int,
        mask_prob: float = 0.15,
    ) -> None:
        if sampler.lengths.tolist() != [len(s) for s in sequences]:
            raise UserError("the sampler was built for other sequence lengths than these")
        self.sequences = [list(s) for s in sequences]
        self.sampler = sampler
        self.pad_id, self.mask_id = pad_id, mask_id
        self.special_ids = tuple(special_ids)
        self.vocab_size = vocab_size
        self.mask_prob = mask_prob

    def __len__(self) -> int:
        return len(self.sequences)

    def batches(self, epoch: int) -> list[list[int]]:
        """Example indices of each batch of ``epoch``."""
        return self.sampler.batches(epoch)

    def collate(
        self, indices: Sequence[int], generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """Masked ``input_ids`` (B, T), ``lengths`` (B,), ``where`` (B, T), ``targets`` (N,)."""
        ids, lengths = pad_batch([self.sequences[i] for i in indices], self.pad_id)
        corrupted, where, targets = mask_tokens(
            ids,
            lengths,
            self.special_ids,
            self.mask_id,
            self.vocab_size,
            self.mask_prob,
            generator,
        )
        return {"input_ids": corrupted, "lengths": lengths, "where": where, "targets": targets}

    @staticmethod
    def num_tokens(batch: dict[str, Tensor]) -> int:
        """Real tokens in a collated batch (for tokens/second)."""
        return int(batch["lengths"].sum())
