"""Tests for the engine-facing `ClassificationData`."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from attnlab.data.buckets import PAD_MULTIPLE, LengthBucketSampler, bucket_length
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
        width = bucket_length(int(batch["lengths"].max()), data.longest)
        assert batch["input_ids"].shape == (len(indices), width)
        assert (batch["input_ids"][:, 0] == CLS_ID).all()
        assert int(batch["lengths"].max()) <= 4
        seen.update(batch["labels"].tolist())
        tokens += data.num_tokens(batch)
    assert seen == Counter(vocab.encode(labels))
    assert tokens == sum(min(len(t) + 1, 4) for t in texts)
    assert data.batches(0) == data.batches(0)


def test_a_run_meets_a_few_batch_widths_not_one_per_length(seed) -> None:
    """Every new (B, T) costs memory that outlives its step (oneDNN's kernel cache, allocator
    blocks): widths must come from a small fixed set, whatever the texts' lengths."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 191, (3000,), generator=g).tolist()
    sequences = [[5] * n for n in lengths]
    data = ClassificationData(sequences, [0] * 3000, LengthBucketSampler(lengths, 64, seed=seed))
    widths = {data.collate(b)["input_ids"].shape[1] for e in range(3) for b in data.batches(e)}
    allowed = set(range(PAD_MULTIPLE, 190, PAD_MULTIPLE)) | {190}
    assert widths <= allowed and len(widths) <= len(allowed) == 12, sorted(widths)
    assert bucket_length(17, 190) == 32 and bucket_length(185, 190) == 190
    assert bucket_length(200, 190) == 200  # a row longer than `longest` is never cut


def test_the_extra_padding_leaves_the_classifier_unchanged(seed) -> None:
    from attnlab.data.buckets import pad_batch
    from attnlab.models.classifier import ClassifierConfig, build_classifier

    cfg = ClassifierConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=32)
    cfg.ngram_buckets, cfg.pooling = 64, "mean"
    model = build_classifier(cfg).double().eval()
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(4, 30, (n,), generator=g).tolist() for n in (17, 9, 3)]
    exact = pad_batch(seqs)  # width 17
    padded = pad_batch(seqs, length=bucket_length(17, 190))  # width 32
    assert padded[0].shape == (3, 32)
    with torch.no_grad():
        assert torch.allclose(model(*exact), model(*padded), atol=1e-12)


def test_mismatched_sampler_or_labels_are_rejected() -> None:
    with pytest.raises(ValueError, match="sampler"):
        ClassificationData([[1, 2]], [0], LengthBucketSampler([3], 1))
    with pytest.raises(ValueError, match="labels"):
        ClassificationData([[1, 2]], [0, 1], LengthBucketSampler([2], 1))


def test_evaluation_batches_of_long_texts_hold_fewer_rows() -> None:
    from attnlab.data.readers import EVAL_ROW_TOKENS, CharReader, dataset

    texts = ["好" * 3] * 40 + ["差" * 500] * 12
    reader = CharReader(CharTokenizer.build(texts), max_len=512, add_cls=False)
    evaluation = dataset(reader, texts, [0] * len(texts), batch_size=8)
    batches = evaluation.batches(0)
    assert sorted(i for b in batches for i in b) == list(range(len(texts)))
    assert max(len(b) for b in batches) == 8  # short texts: batch_size rows
    longest = max(len(b) * max(len(evaluation.sequences[i]) for i in b) for b in batches)
    assert longest <= 8 * EVAL_ROW_TOKENS  # long texts: the token budget, so 2 rows of 500
    training = dataset(reader, texts, [0] * len(texts), batch_size=8, shuffle=True)
    assert {len(b) for b in training.batches(0)} == {8, 4}  # training keeps its batch size
