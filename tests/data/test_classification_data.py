"""Tests for the engine-facing `ClassificationData`."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from attnlab.data.buckets import LengthBucketSampler
from attnlab.data.char_tokenizer import CLS_ID, CharTokenizer
from attnlab.data.classification import ClassificationData
from attnlab.data.labels import LabelVocab


def test_collate_returns_padded_long_tensors() -> None:
    sequences = [[4, 5, 6], [7], [8, 9]]
    data = ClassificationData(sequences, [1, 0, 1], LengthBucketSampler([3, 1, 2], 2))
    batch = data.collate([2, 0])
    assert set(batch) == {"input_ids", "lengths", "labels"}
    assert all(t.dtype == torch.long for t in batch.values())
    assert batch["input_ids"].tolist() == [[8, 9, 0], [4, 5, 6]]
    assert batch["lengths"].tolist() == [2, 3]
    assert batch["labels"].tolist() == [1, 1]
    assert data.num_tokens(batch) == 5


def test_from_texts_then_an_epoch_like_the_engine() -> None:
    texts = ["很好", "差", "一般般吧", "太差了", "不错不错不错"] * 4
    labels = ["pos", "neg", "neg", "neg", "pos"] * 4
    vocab = LabelVocab.build(labels)
    tok = CharTokenizer.build(texts)
    data = ClassificationData.from_texts(
        texts, labels, tok, vocab, max_len=4, add_cls=True, batch_size=3, shuffle=True, seed=1
    )
    seen: Counter[int] = Counter()
    tokens = 0
    for indices in data.batches(epoch=0):
        batch = data.collate(indices)
        assert batch["input_ids"].shape == (len(indices), int(batch["lengths"].max()))
        assert (batch["input_ids"][:, 0] == CLS_ID).all()
        assert int(batch["lengths"].max()) <= 4
        seen.update(batch["labels"].tolist())
        tokens += data.num_tokens(batch)
    assert seen == Counter(vocab.encode(labels))
    assert tokens == sum(min(len(t) + 1, 4) for t in texts)
    assert data.batches(0) == data.batches(0)


def test_mismatched_sampler_or_labels_are_rejected() -> None:
    with pytest.raises(ValueError, match="sampler"):
        ClassificationData([[1, 2]], [0], LengthBucketSampler([3], 1))
    with pytest.raises(ValueError, match="labels"):
        ClassificationData([[1, 2]], [0, 1], LengthBucketSampler([2], 1))
