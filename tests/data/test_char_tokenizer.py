"""Tests for the character tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.data.char_tokenizer import CLS_ID, PAD_ID, SPECIALS, UNK_ID, CharTokenizer
from attnlab.data.errors import DataError


def test_build_orders_by_frequency_then_code_point() -> None:
    tok = CharTokenizer.build(["好好好差", "差a好b"])
    assert tok.id_to_token == [*SPECIALS, "好", "差", "a", "b"]
    assert (PAD_ID, UNK_ID, CLS_ID) == (0, 1, 2) and tok.id_to_token[3] == "<mask>"
    assert CharTokenizer.build(["差a好b", "好好好差"]).id_to_token == tok.id_to_token


def test_min_freq_and_max_vocab() -> None:
    texts = ["aaab", "bc"]
    assert CharTokenizer.build(texts, min_freq=2).id_to_token[4:] == ["a", "b"]
    assert CharTokenizer.build(texts, max_vocab=5).vocab_size == 5
    with pytest.raises(ValueError, match="max_vocab"):
        CharTokenizer.build(texts, max_vocab=4)


def test_encode_truncates_keeping_the_head_with_cls_counted() -> None:
    tok = CharTokenizer.build(["abcde"])
    a, b, c = (tok.token_to_id[ch] for ch in "abc")
    assert tok.encode("abcde", 3) == [a, b, c]
    assert tok.encode("abcde", 3, add_cls=True) == [CLS_ID, a, b]
    assert tok.encode("aZ", 10) == [a, UNK_ID]
    assert tok.tokens("aZb", 10, add_cls=True) == ["<cls>", "a", "<unk>", "b"]
    with pytest.raises(ValueError, match="max_len"):
        tok.encode("a", 0)


def test_head_and_tail_truncation_keeps_the_ending() -> None:
    tok = CharTokenizer.build(["abcdefghij"])
    dec = tok.decode
    assert dec(tok.encode("abcdefghij", 6, tail_share=0.5)) == "abchij"
    assert dec(tok.encode("abcdefghij", 6, tail_share=1.0)) == "efghij"
    assert dec(tok.encode("abcdefghij", 6, tail_share=0.0)) == "abcdef"
    assert tok.encode("abcdefghij", 7, add_cls=True, tail_share=0.5)[0] == CLS_ID
    assert dec(tok.encode("abcdefghij", 7, add_cls=True, tail_share=0.5)) == "abchij"
    assert dec(tok.encode("abc", 6, tail_share=0.5)) == "abc"  # short texts are untouched
    assert tok.tokens("abcdefghij", 4, tail_share=0.5) == ["a", "b", "i", "j"]
    with pytest.raises(ValueError, match="tail_share"):
        tok.encode("abc", 2, tail_share=1.5)


def test_full_and_half_width_forms_stay_distinct() -> None:
    tok = CharTokenizer.build(["，,"])
    assert tok.encode("，", 5) != tok.encode(",", 5)


@settings(deadline=None)  # hypothesis' 200 ms deadline fails on a loaded machine
@given(st.text(min_size=1, max_size=40))
def test_decode_inverts_encode_for_known_characters(text: str) -> None:
    tok = CharTokenizer.build([text])
    ids = tok.encode(text, len(text) + 1, add_cls=True)
    assert len(tok.tokens(text, len(text) + 1, add_cls=True)) == len(ids)
    assert tok.decode(ids + [PAD_ID, PAD_ID]) == text
    assert tok.decode([CLS_ID], skip_specials=False) == "<cls>"


def test_decode_rejects_unknown_ids() -> None:
    with pytest.raises(ValueError, match="outside"):
        CharTokenizer.build(["a"]).decode([5])


def test_save_load_round_trip_keeps_characters_readable(tmp_path: Path) -> None:
    tok = CharTokenizer.build(["好评如潮", "差评"])
    path = tmp_path / "sub" / "tok.json"
    tok.save(path)
    assert "好" in path.read_text(encoding="utf-8")
    loaded = CharTokenizer.load(path)
    assert loaded.id_to_token == tok.id_to_token
    assert loaded.encode("好差?", 8) == tok.encode("好差?", 8)


@pytest.mark.parametrize(
    "payload",
    [
        {"format": "other"},
        {"format": "attnlab.char_tokenizer"},
        {"format": "attnlab.char_tokenizer", "vocab": ["<unk>", "<pad>", "<cls>", "<mask>"]},
        {"format": "attnlab.char_tokenizer", "vocab": [*SPECIALS, "ab"]},
        {"format": "attnlab.char_tokenizer", "vocab": [*SPECIALS, "a", "a"]},
    ],
)
def test_load_rejects_bad_files(tmp_path: Path, payload: dict) -> None:
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(payload), encoding="utf-8")
    with pytest.raises(DataError) as err:
        CharTokenizer.load(path)
    assert str(path) in str(err.value)
