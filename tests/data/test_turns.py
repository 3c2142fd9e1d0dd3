"""Turned sentences composed from real clauses (attnlab.data.turns): which clauses qualify, the
rule's labels, determinism, counts, and that only the given (training) texts are used."""

from __future__ import annotations

import random

import pytest

from attnlab.data.turns import (
    EN_TURNS,
    ZH_CONCEDE,
    ZH_TURNS,
    Clause,
    clause_pool,
    compose_turns,
    concessions,
    count_for_share,
    is_mild,
    neutral,
    qualifies_en,
    qualifies_zh,
    select,
    zh_clauses,
)
from attnlab.errors import UserError

POS = ["房间干净整洁", "服务态度非常好", "屏幕显示效果很棒", "这本书写得很感人", "早餐种类丰富"]
NEG = ["隔音效果太差", "电池用不了多久", "前台服务员态度冷淡", "印刷质量很糟糕", "空调一直有噪音"]


def _corpus(rng: random.Random) -> tuple[list[str], list[str]]:
    """Training texts of one to three clauses each, drawn from the clause lists above, every
    clause joined with its own label's clauses only."""
    texts, labels = [], []
    for _ in range(40):
        label = rng.choice(["positive", "negative"])
        parts = rng.sample(POS if label == "positive" else NEG, rng.randint(1, 3))
        texts.append(rng.choice(["，", "。", "！"]).join(parts) + rng.choice(["", "。", "!"]))
        labels.append(label)
    return texts, labels


def _split_turn(text: str, turns) -> tuple[str, str]:
    """(first clause, last clause) of a composed text, by the turn that joins them."""
    for opener, turn in sorted(turns, key=lambda t: -len(t[0])):  # 虽然… before the bare turn
        if text.startswith(opener) and turn in text:
            first, last = text[len(opener) :].split(turn, 1)
            return first, last.rstrip("。 .")
    raise AssertionError(f"no turn in {text!r}")


def test_zh_clauses_split_and_strip_enumerators():
    assert zh_clauses("1、房间很干净 服务好！2.早餐一般……价格3.5元") == [
        "房间很干净", "服务好", "早餐一般", "价格3.5元",
    ]  # fmt: skip
    assert zh_clauses("（2）位置不错；③交通方便") == ["位置不错", "交通方便"]


@pytest.mark.parametrize(
    "clause, ok",
    [
        ("房间干净整洁", True),
        ("房间不大但是干净", False),  # turns on its own
        ("可惜早餐一般", False),
        ("位置却很偏", False),
        ("好", False),  # too short
        ("这家酒店的房间真的是非常非常非常非常干净整洁", False),  # too long
        ("ThinkPad T400", False),  # not Chinese
    ],
)
def test_qualifies_zh(clause, ok):
    assert qualifies_zh(clause) is ok


def test_qualifies_en():
    assert qualifies_en("the acting is superb throughout")
    assert not qualifies_en("the acting is superb but the plot drags")
    assert not qualifies_en("bad . very bad")
    assert not qualifies_en("too short")


def test_pool_holds_only_clauses_of_the_given_texts_with_their_labels():
    rng = random.Random(1)
    texts, labels = _corpus(rng)
    held = ["隔音效果太差但是位置很好", "位置很好"]  # never passed: must never appear
    pool = clause_pool(texts, labels)
    assert pool
    for clause in pool:
        assert clause.text in texts[clause.source]
        assert clause.label == labels[clause.source]
        assert clause.text in (POS if clause.label == "positive" else NEG)
        assert clause.whole == (texts[clause.source].rstrip("。!") == clause.text)
    assert not {c.text for c in pool} & set(held)


def test_pool_drops_clauses_seen_under_both_labels_and_other_labels():
    pool = clause_pool(
        ["房间干净整洁，早餐种类丰富", "房间干净整洁，隔音效果太差", "服务态度非常好"],
        ["positive", "negative", "neutral"],
    )
    assert sorted(c.text for c in pool) == ["早餐种类丰富", "隔音效果太差"]


def test_select_by_scores_and_by_whole_texts():
    pool = [Clause("aaaa", "positive", 0, True), Clause("bbbb", "negative", 1, False),
            Clause("cccc", "negative", 2, True)]  # fmt: skip
    assert select(pool) == [pool[0], pool[2]]
    assert select(pool, [0.9, 0.8, 0.79], threshold=0.8) == pool[:2]
    with pytest.raises(UserError):
        select(pool, [0.9])


@pytest.mark.parametrize("language", ["zh", "en"])
def test_labels_follow_the_rule_and_counts(language):
    rng = random.Random(7)
    if language == "zh":
        texts, labels = _corpus(rng)
        turns = ZH_TURNS
    else:
        pos = ["a moving and beautifully acted film", "the script is sharp and funny throughout"]
        neg = ["the plot is a tedious mess", "every joke falls completely flat here"]
        texts, labels = pos + neg, ["positive"] * 2 + ["negative"] * 2
        turns = EN_TURNS
    pool = clause_pool(texts, labels, language)
    polarity = {c.text: c.label for c in pool}
    n = 2 * rng.randint(3, 8) + 1
    out = compose_turns(pool, n, seed=rng.randint(0, 10**6), language=language)
    assert len(out.texts) == len(set(out.texts)) == n
    assert out.labels.count("positive") == n // 2 + 1
    assert out.labels.count("negative") == n // 2
    for text, label in zip(out.texts, out.labels):
        first, last = _split_turn(text, turns)
        assert polarity[last] == label  # the clause after the turn decides
        assert polarity[first] != label  # and the other side is the opposite polarity


def test_seeded():
    texts, labels = _corpus(random.Random(3))
    pool = clause_pool(texts, labels)
    a = compose_turns(pool, 12, seed=5)
    assert a.texts == compose_turns(pool, 12, seed=5).texts
    assert a.texts != compose_turns(pool, 12, seed=6).texts


def test_held_out_texts_are_never_composed():
    pool = [
        Clause("房间干净整洁", "positive", 0, True),
        Clause("隔音效果太差", "negative", 1, True),
    ]
    # every text a single (positive-ending) example can be: all but one are held out
    every = sorted(
        f"{o}隔音效果太差{t}房间干净整洁{end}" for o, t in ZH_TURNS for end in ("", "。")
    )
    keep = random.choice(every)
    held = set(every) - {keep}
    assert compose_turns(pool, 1, seed=random.randint(0, 10**6), held_out=held).texts == [keep]


def test_too_many_or_one_polarity_refused():
    pool = [
        Clause("房间干净整洁", "positive", 0, True),
        Clause("隔音效果太差", "negative", 1, True),
    ]
    with pytest.raises(UserError, match="at most"):
        compose_turns(pool, 100, seed=0)
    with pytest.raises(UserError, match="both polarities"):
        compose_turns(pool[:1], 2, seed=0)


NEUTRAL = ["酒店位于市中心", "这本书是上周买的", "电影讲的是一个家庭"]


def test_neutral_clauses_are_those_read_near_one_half():
    pool = [Clause(t, "positive", i, True) for i, t in enumerate(["aaaa", "bbbb", "cccc", "dddd"])]
    assert neutral(pool, [0.39, 0.4, 0.6, 0.61]) == ["bbbb", "cccc"]
    with pytest.raises(UserError):
        neutral(pool, [0.5])


def test_neutral_first_turns_open_with_a_neutral_clause_and_keep_the_rule():
    rng = random.Random(11)
    texts, labels = _corpus(rng)
    pool = clause_pool(texts, labels)
    polarity = {c.text: c.label for c in pool}
    n, share = 2 * rng.randint(4, 9), rng.choice([0.25, 0.5, 1.0])
    out = compose_turns(pool, n, seed=rng.randint(0, 10**6), neutral_first=NEUTRAL,
                        neutral_share=share)  # fmt: skip
    firsts = [_split_turn(text, ZH_TURNS)[0] for text in out.texts]
    opened = [i for i, first in enumerate(firsts) if first in NEUTRAL]
    assert len(opened) == round(share * n)
    assert sorted(out.labels[i] for i in opened).count("positive") == (len(opened) + 1) // 2
    for text, label in zip(out.texts, out.labels):
        assert polarity[_split_turn(text, ZH_TURNS)[1]] == label  # the last clause decides
    assert out.stats["neutral_first"] == len(opened)
    # none asked: the composition is the one without neutral clauses, draw for draw
    seed = rng.randint(0, 10**6)
    plain = compose_turns(pool, n, seed=seed)
    assert compose_turns(pool, n, seed=seed, neutral_first=NEUTRAL).texts == plain.texts
    assert "neutral_first" not in plain.stats


def test_neutral_first_refused_without_neutral_clauses_or_beyond_them():
    pool = [
        Clause("房间干净整洁", "positive", 0, True),
        Clause("隔音效果太差", "negative", 1, True),
    ]
    with pytest.raises(UserError, match="no clause as neutral"):
        compose_turns(pool, 4, seed=0, neutral_share=0.5)
    with pytest.raises(UserError, match="neutral clauses would repeat"):
        compose_turns(pool, 40, seed=0, neutral_first=NEUTRAL[:1], neutral_share=1.0)
    with pytest.raises(UserError, match="share"):
        compose_turns(pool, 4, seed=0, neutral_first=NEUTRAL, neutral_share=1.5)


MILD_POS = [Clause(t, "positive", i, False) for i, t in enumerate(["前台还算热情", "早餐还可以"])]
MILD_NEG = [Clause(t, "negative", i, False) for i, t in enumerate(["机身有点重", "屏幕略显暗淡"])]


def test_mild_clauses_hold_a_weakening_word():
    assert is_mild("前台还算热情") and is_mild("机身有点重")
    assert not is_mild("房间干净整洁") and not is_mild("隔音效果太差")
    assert is_mild("the ending is a bit slow", "en") and is_mild("a fairly decent cast", "en")
    assert not is_mild("a bitter and tedious film", "en")  # a word, not a part of one


def test_concessions_take_the_polarity_the_scorer_reads():
    # a mild clause read as its text's label keeps it, one read as the other takes the other;
    # one near one half, and a clause that is not mild, are dropped
    texts = ["前台还算热情", "机身有点重", "早餐倒是还可以", "房间干净整洁"]
    labels = ["negative", "negative", "positive", "positive"]
    pool = [Clause(t, y, i, False) for i, (t, y) in enumerate(zip(texts, labels))]
    out = concessions(pool, [0.1, 0.9, 0.55, 0.99])
    assert [(c.text, c.label) for c in out] == [(texts[0], "positive"), (texts[1], "negative")]
    with pytest.raises(UserError):
        concessions(pool, [0.5])


def test_conceded_turns_put_the_verdict_first_and_keep_the_rest_draw_for_draw():
    rng = random.Random(rng_seed := random.randint(0, 10**6))
    texts, labels = _corpus(rng)
    pool = clause_pool(texts, labels)
    polarity = {c.text: c.label for c in pool} | {c.text: c.label for c in MILD_POS + MILD_NEG}
    n, share = 2 * rng.randint(4, 9), rng.choice([0.25, 0.5, 1.0])
    seed = rng.randint(0, 10**6)
    out = compose_turns(pool, n, seed=seed, conceded=MILD_POS + MILD_NEG, concession_share=share)
    k = round(share * n)
    assert len(out.texts) == len(set(out.texts)) == n, rng_seed
    plain = compose_turns(pool, n, seed=seed)
    assert out.texts[: n - k] == plain.texts[: n - k]  # the turns before them are unchanged
    assert out.stats["conceded"] == k and "conceded" not in plain.stats
    for text, label in zip(out.texts[n - k :], out.labels[n - k :]):
        first, last = _split_turn(text, [("", t) for t in ZH_CONCEDE])
        assert polarity[first] == label and not is_mild(first), rng_seed  # the verdict decides
        assert polarity[last] != label and is_mild(last), rng_seed  # mild, the other side
    assert abs(out.labels[n - k :].count("positive") - k / 2) <= 0.5, rng_seed  # half each
    # none asked: the composition is the one without them
    assert compose_turns(pool, n, seed=seed, conceded=MILD_POS).texts == plain.texts


def test_conceded_turns_refused_without_mild_clauses_of_both_sides_or_beyond_all():
    texts, labels = _corpus(random.Random(5))
    pool = clause_pool(texts, labels)
    with pytest.raises(UserError, match="mild clauses of both"):
        compose_turns(pool, 4, seed=0, conceded=MILD_POS, concession_share=0.5)
    with pytest.raises(UserError, match="add up to at most 1"):
        compose_turns(pool, 4, seed=0, neutral_first=NEUTRAL, neutral_share=0.5,
                      conceded=MILD_POS + MILD_NEG, concession_share=0.75)  # fmt: skip
    with pytest.raises(UserError, match="would repeat"):
        compose_turns(pool, 400, seed=0, conceded=MILD_POS[:1] + MILD_NEG[:1],
                      concession_share=1.0)  # fmt: skip


def test_count_for_share():
    n_train = random.randint(100, 10_000)
    share = random.uniform(0.05, 0.5)
    n = count_for_share(share, n_train)
    assert abs(n / (n_train + n) - share) <= 1 / n_train
    with pytest.raises(UserError):
        count_for_share(1.0, n_train)


def test_language_of_counts_the_texts_by_script():
    from attnlab.data.turns import language_of

    assert language_of(["剧情紧凑", "很好看，推荐 ok", "good film"])[0] == "zh"
    shares = {"zh": 0.3333, "en": 0.6667}
    assert language_of(["a good film", "bad acting", "剧情紧凑"]) == ("en", shares)
    assert language_of(["すばらしい", "つまらない", "good"])[0] is None
    assert language_of(["123", "!!"])[0] is None
