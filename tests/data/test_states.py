"""StateData: cached lower-block states batched exactly as the token data they came from."""

from __future__ import annotations

import pytest
import torch

from attnlab.data import LengthBucketSampler
from attnlab.data.states import StateData
from attnlab.errors import UserError


def test_batches_and_padding_follow_the_token_data(seed=0):
    torch.manual_seed(seed)
    lengths = [5, 1, 17, 3, 9, 9, 2]
    states = [torch.randn(n, 4) for n in lengths]
    data = StateData(states, [0, 1, 0, 1, 1, 0, 1], LengthBucketSampler(lengths, 3, seed=4), 2)
    tokens = LengthBucketSampler(lengths, 3, seed=4)
    for epoch in range(3):
        assert data.batches(epoch) == tokens.batches(epoch), f"seed {seed}"
    batch = data.collate([2, 1, 4])
    assert batch["hidden"].shape == (3, 17, 4) and batch["start"] == 2
    assert batch["lengths"].tolist() == [17, 1, 9] and batch["labels"].tolist() == [0, 1, 1]
    torch.testing.assert_close(batch["hidden"][2, :9], states[4].half().float())
    assert not batch["hidden"][1, 1:].any() and not batch["hidden"][2, 9:].any()
    assert data.nbytes() == sum(lengths) * 4 * 2


def test_states_that_do_not_fit_their_labels_or_sampler_are_refused():
    states = [torch.zeros(2, 4), torch.zeros(3, 4)]
    with pytest.raises(UserError, match="2 cached states but 1 labels"):
        StateData(states, [0], LengthBucketSampler([2, 3], 2), 1)
    with pytest.raises(UserError, match="other sequence lengths"):
        StateData(states, [0, 1], LengthBucketSampler([2, 4], 2), 1)


def test_throughput_counts_the_tokens_not_the_padding():
    states = [torch.zeros(n, 2) for n in (3, 7)]
    data = StateData(states, [0, 1], LengthBucketSampler([3, 7], 2), 1)
    assert data.num_tokens(data.collate([0, 1])) == 10
