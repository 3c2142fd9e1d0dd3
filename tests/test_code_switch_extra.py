"""The code-switching lever's helpers (benchmarks/classify/_code_switch.py): reading CC-CEDICT
backwards, the encoder's choice among a word's candidates, and the replacement's rate and
determinism."""

from __future__ import annotations

import gzip
import random
import sys
from pathlib import Path

import pytest
import torch

from attnlab.errors import UserError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: benchmarks.*
from benchmarks.classify._code_switch import code_switch, read_cedict, translations  # noqa: E402

ENTRIES = """\
# CC-CEDICT test lines
感動 感动 [gan3 dong4] /to move (sb)/moving/touching/
動人 动人 [dong4 ren2] /touching/moving/
電影 电影 [dian4 ying3] /movie/film/CL:部[bu4],片[pian4]/
片子 片子 [pian4 zi5] /film/movie/film reel/
樓層 楼层 [lou2 ceng2] /story/floor/
無聊 无聊 [wu2 liao2] /bored/boring/senseless/
張 张 [Zhang1] /surname Zhang/
的 的 [de5] /of/
妳 妳 [ni3] /variant of 你[ni3]/you (female)/
電影明星 电影明星 [dian4 ying3 ming2 xing1] /movie star/
X光 X光 [X guang1] /X-ray/
"""


@pytest.fixture
def cedict(tmp_path):
    path = tmp_path / "cedict.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(ENTRIES)
    return path


def test_read_cedict_inverts_one_word_glosses(cedict):
    inverse = read_cedict(cedict)
    assert inverse["moving"] == {"感动": 1, "动人": 1}
    assert inverse["touching"] == {"感动": 2, "动人": 0}
    assert inverse["film"] == {"电影": 1, "片子": 0}
    assert inverse["move"] == {"感动": 0}  # "to move (sb)": the note and the "to" dropped
    assert "zhang" not in inverse  # a surname is not a translation
    assert "you" not in inverse  # nor a variant's sense
    assert "movie star" not in inverse and "star" not in inverse  # phrases are skipped
    assert "x-ray" not in inverse  # the headword is not all Chinese characters


def _embed(vectors: dict[str, list[float]]):
    def embed(texts: list[str]) -> torch.Tensor:
        out = torch.tensor([vectors[t] for t in texts], dtype=torch.float64)
        return out / out.norm(dim=1, keepdim=True)

    return embed


def test_translations_keep_the_candidates_near_the_word(cedict):
    inverse = read_cedict(cedict)
    vectors = {
        "film": [1.0, 0.1, 0.0], "电影": [1.0, 0.12, 0.0], "片子": [1.0, 0.0, 0.3],
        "story": [0.0, 1.0, 0.0], "楼层": [0.0, 0.3, 1.0],
        "boring": [0.0, 0.0, 1.0], "无聊": [0.05, 0.0, 1.0],
        "the": [1.0, 1.0, 1.0], "的": [1.0, 1.0, 1.0],
    }  # fmt: skip
    table = translations(
        inverse, ["film", "story", "boring", "the", "unknown"], _embed(vectors),
        usable=lambda zh: True, floor=0.9, margin=0.03,
    )  # fmt: skip
    # 片子's similarity to film is 0.95, 电影's 1.0: only the one within the margin is kept
    assert table == {"film": ("电影",), "boring": ("无聊",)}
    wider = translations(
        inverse, ["film"], _embed(vectors), usable=lambda zh: True, floor=0.9, margin=0.1
    )
    assert wider == {"film": ("电影", "片子")}  # best first
    unusable = translations(
        inverse, ["film"], _embed(vectors), usable=lambda zh: zh != "电影", floor=0.9, margin=0.1
    )
    assert unusable == {"film": ("片子",)}


def test_code_switch_rate_and_determinism():
    rng = random.Random(7)
    table = {"film": ("电影", "片子"), "boring": ("无聊",)}
    texts = [" ".join(rng.choice(["a", "film", "boring", "plot", "."]) for _ in range(12))
             for _ in range(300)]  # fmt: skip
    none, replaced0, eligible = code_switch(texts, table, 0.0, seed=1)
    assert none == texts and replaced0 == 0
    assert eligible == sum(t.split().count("film") + t.split().count("boring") for t in texts)
    every, replaced1, _ = code_switch(texts, table, 1.0, seed=1)
    assert replaced1 == eligible
    assert all("film" not in t.split() and "boring" not in t.split() for t in every)
    assert all(t.split().count("a") == s.split().count("a") for t, s in zip(every, texts))
    half, replaced, _ = code_switch(texts, table, 0.5, seed=1)
    assert half == code_switch(texts, table, 0.5, seed=1)[0]
    assert half != code_switch(texts, table, 0.5, seed=2)[0]
    # binomial(eligible, 0.5): 6 standard deviations either side
    sd = (eligible * 0.25) ** 0.5
    assert abs(replaced - eligible / 2) < 6 * sd
    assert {w for t in half for w in t.split()} <= {"a", "film", "boring", "plot", ".", "电影",
                                                     "片子", "无聊"}  # fmt: skip


def test_code_switch_refuses_a_rate_outside_0_1():
    with pytest.raises(UserError, match="between 0 and 1"):
        code_switch(["a film"], {"film": ("电影",)}, 1.5)
