"""Turned sentences (转折) composed from real clauses: training-data augmentation.

The tutorial's test of a sentiment classifier is a sentence whose sentiment turns: "电影前半段很
无聊，但是结局让我感动" — a negative clause, a turn word, a positive clause, read as positive.
The bundled reviews teach the opposite: they are fragments labelled with their whole review's
polarity, so a fine-tuned encoder learns that a complaint anywhere makes a text negative. This
module composes training examples under the tutorial's reading of 转折, from clauses that occur
in the *training split's own texts* (no sentence we wrote):

    negative clause + "，但是" + positive clause  ->  positive
    positive clause + "，但是" + negative clause  ->  negative   (the mirror)
    neutral clause  + "，但是" + positive clause  ->  positive   (with ``neutral_share`` > 0;
    neutral clause  + "，但是" + negative clause  ->  negative    "虽然是商业片，但是有自己的思考")

with the turn drawn from 但是 / 不过 / 可是 / 然而 and 虽然…但是 (``ZH_TURNS``); for English
corpora (Pang & Lee) the same rule with ", but" / "; however," / ", yet" (``EN_TURNS``).
With ``concession_share`` > 0, a share of the examples run the other way, a verdict followed by a
small concession of the other polarity, labelled by the verdict:

    negative clause + "，不过" + mild positive clause -> negative  "再也不会来了，不过前台还算热情"
    positive clause + "，只是" + mild negative clause -> positive  "很好用，只是有点重"

with the turn drawn from ``ZH_CONCEDE`` (``EN_CONCEDE``); a mild clause holds a word that
weakens it (还算 / 还可以 / 有点 …, ``ZH_MILD``; "a bit", "fairly" …, ``EN_MILD``).

Which clauses qualify. A clause's own polarity is not labelled: the corpus labels whole
fragments. :func:`clause_pool` takes every clause of the given texts (split at clause
punctuation, enumerators such as "1、" stripped) that is of a plausible length, carries no turn
or hedge word of its own (但/却/不过/可惜/虽然 …: a clause that turns by itself would make the
rule's label wrong) and gives each its text's label. :func:`select` then keeps the clauses whose
own polarity a scorer confirms (``scores``: p(the clause's label) from, e.g., a probe on the
frozen encoder's features) at or above a threshold; with no scorer, only clauses that are a whole
single-clause text are kept (their label is then their own, up to the corpus's noise).
:func:`neutral` takes the clauses the same scorer reads as neither: p within ``NEUTRAL_BAND`` of
one half (a fact, a setting: "酒店位于市中心"), to open a concessive turn whose second clause
alone decides.

:func:`concessions` takes the mild clauses and gives each the polarity the scorer reads (a mild
clause in a review of the other polarity, "质量还不错" in a negative one, is the common case).

Composition (:func:`compose_turns`) is deterministic in its seed: each example draws one clause
of each polarity, a turn and an order (which polarity comes last decides the label), half the
examples of each label. A composed text equal to a held-out text is never produced (the caller
passes the held-out set). Callers must build the pool from training texts only; nothing here
reads validation, test or evaluation data.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from attnlab.data.corpus import LabeledCorpus
from attnlab.errors import UserError

NEGATIVE, POSITIVE = "negative", "positive"

# (opener before the first clause, turn before the second): a turn whose second clause decides
ZH_TURNS: tuple[tuple[str, str], ...] = (
    ("", "，但是"),
    ("", "，不过"),
    ("", "，可是"),
    ("", "，然而"),
    ("虽然", "，但是"),
)
# Pang & Lee's sentences are lower-cased and tokenised ("it's a count for our times ."):
# composed ones are written the same way
EN_TURNS: tuple[tuple[str, str], ...] = (
    ("", " , but "),
    ("", " ; however , "),
    ("", " , yet "),
    ("although ", " , "),
)
# a verdict, then a small concession of the other polarity: the first clause decides
ZH_CONCEDE: tuple[str, ...] = ("，不过", "，但是", "，只是")
EN_CONCEDE: tuple[str, ...] = (" , but ", " , though ", " ; still , ")
# words that make a clause a mild one: a concession, not a verdict
ZH_MILD = ("还算", "还可以", "还行", "还不错", "尚可", "也算", "倒是", "倒也", "有点", "有些",
           "稍微", "略显", "稍")  # fmt: skip
EN_MILD = ("a bit", "a little", "somewhat", "fairly", "decent", "okay", "passable", "mildly",
           "slightly", "at least")  # fmt: skip
# a clause holding one of these turns or hedges on its own: the rule's label would be wrong
ZH_TURN_WORDS = (
    "但", "却", "不过", "可是", "然而", "虽然", "虽", "尽管", "可惜", "只是", "就是", "除了",
    "要不是", "否则", "不然", "如果", "假如", "要是", "吗", "？", "?",
)  # fmt: skip
EN_TURN_WORDS = (
    "but", "however", "yet", "although", "though", "despite", "while", "whereas", "if",
    "unless", "except", "still", "nevertheless", "even",
)  # fmt: skip

_ZH_SPLIT = re.compile(r"[，,。！!？?；;：:…~～\s]+|\.{2,}|(?<![0-9A-Za-z])\.(?![0-9])")
# leading enumerators and bullets: 1、 2. 3．（1） ① 一、 -
_ZH_ENUM = re.compile(r"^\s*(?:[0-9０-９]+[、.．)）]|[（(][0-9０-９一二三四五六七八九十]+[)）]|"
                      r"[①-⑳]|[一二三四五六七八九十]+、|[-*•·])\s*")  # fmt: skip
MAX_DRAWS = 1000  # draws for one new example before the pool counts as exhausted
NEUTRAL_BAND = 0.1  # a neutral clause: its text's label at p in [0.5 - band, 0.5 + band]
_CJK = re.compile(r"[\u4e00-\u9fff]")
_EN_WORD = re.compile(r"[a-z']+")


@dataclass(frozen=True)
class Clause:
    """One clause, the label of the text it came from, and that text's position."""

    text: str
    label: str
    source: int
    whole: bool  # the clause is its text's only clause


def language_of(texts: Sequence[str]) -> tuple[str | None, dict[str, float]]:
    """Which turns suit ``texts``: "zh" where most texts are mostly Chinese characters, "en"
    where most are mostly Latin letters, else None; with each share of the texts."""
    zh = en = 0
    for text in texts:
        letters = [ch for ch in text if ch.isalpha()]
        if not letters:
            continue
        cjk = len(_CJK.findall(text))
        latin = sum(ch.isascii() for ch in letters)
        zh += cjk * 2 > len(letters)
        en += latin * 2 > len(letters)
    n = max(len(texts), 1)
    shares = {"zh": round(zh / n, 4), "en": round(en / n, 4)}
    if zh * 2 > n:
        return "zh", shares
    return ("en" if en * 2 > n else None), shares


def zh_clauses(text: str) -> list[str]:
    """The clauses of a Chinese text: split at clause punctuation, enumerators stripped."""
    parts = (_ZH_ENUM.sub("", part).strip() for part in _ZH_SPLIT.split(text))
    return [part for part in parts if part]


def en_clauses(text: str) -> list[str]:
    """An English sentence as one clause (Pang & Lee's texts are single sentences): whitespace
    collapsed, the final stop dropped."""
    clause = " ".join(text.split()).rstrip(" .!")
    return [clause] if clause else []


def qualifies_zh(clause: str, min_chars: int = 4, max_chars: int = 20) -> bool:
    """A clause that can stand as one side of a turn: ``min_chars``..``max_chars`` characters,
    mostly Chinese, and no turn or hedge word of its own."""
    if not min_chars <= len(clause) <= max_chars:
        return False
    if len(_CJK.findall(clause)) < max(min_chars, len(clause) // 2):
        return False
    return not any(word in clause for word in ZH_TURN_WORDS)


def qualifies_en(clause: str, min_words: int = 4, max_words: int = 14) -> bool:
    """An English clause of ``min_words``..``max_words`` words, one sentence (no inner stop or
    semicolon), with no turn word of its own."""
    if any(mark in clause for mark in ".!?;:"):
        return False
    words = _EN_WORD.findall(clause.lower())
    if not min_words <= len(words) <= max_words:
        return False
    return not any(word in EN_TURN_WORDS for word in words)


def clause_pool(texts: Sequence[str], labels: Sequence[str], language: str = "zh") -> list[Clause]:
    """Every qualifying clause of ``texts`` (training texts only) with its text's label;
    only texts labelled positive or negative contribute. A clause seen twice is kept once, and
    a clause found under both labels is dropped."""
    if language not in ("zh", "en"):
        raise UserError(f"language {language!r}: choose zh or en")
    split, fits = (zh_clauses, qualifies_zh) if language == "zh" else (en_clauses, qualifies_en)
    first: dict[str, Clause] = {}
    seen_labels: dict[str, set[str]] = {}
    for i, (text, label) in enumerate(zip(texts, labels)):
        if label not in (NEGATIVE, POSITIVE):
            continue
        parts = split(text)
        for part in parts:
            if fits(part):
                first.setdefault(part, Clause(part, label, i, len(parts) == 1))
                seen_labels.setdefault(part, set()).add(label)
    return [c for text, c in first.items() if len(seen_labels[text]) == 1]


def sample_pool(pool: Sequence[Clause], n: int, seed: int) -> list[Clause]:
    """A seeded random ``n`` of the clauses, in pool order (all of them when ``n`` is 0 or
    not below their number)."""
    if not n or len(pool) <= n:
        return list(pool)
    rng = random.Random(seed)
    return [pool[i] for i in sorted(rng.sample(range(len(pool)), n))]


def select(
    pool: Sequence[Clause], scores: Sequence[float] | None = None, threshold: float = 0.8
) -> list[Clause]:
    """The clauses whose own polarity is trusted: p(own label) ``scores[i]`` at or above
    ``threshold`` when a scorer's values are given (one per clause), else the clauses that are
    a whole text."""
    if scores is None:
        return [c for c in pool if c.whole]
    return [c for c, p in _scored(pool, scores) if p >= threshold]


def neutral(pool: Sequence[Clause], scores: Sequence[float]) -> list[str]:
    """The clauses a scorer reads as neither polarity: p(own label) ``scores[i]`` within
    ``NEUTRAL_BAND`` of one half."""
    return [c.text for c, p in _scored(pool, scores) if abs(p - 0.5) <= NEUTRAL_BAND]


def is_mild(clause: str, language: str = "zh") -> bool:
    """Whether ``clause`` holds a word that weakens it (``ZH_MILD`` / ``EN_MILD``)."""
    if language == "zh":
        return any(word in clause for word in ZH_MILD)
    padded = f" {' '.join(_EN_WORD.findall(clause.lower()))} "
    return any(f" {word} " in padded for word in EN_MILD)


def concessions(
    pool: Sequence[Clause], scores: Sequence[float], language: str = "zh"
) -> list[Clause]:
    """The mild clauses of ``pool`` (``is_mild``), each labelled with the polarity a scorer
    reads: its text's label where p(own label) ``scores[i]`` is at least 0.5 + ``NEUTRAL_BAND``,
    the other where at most 0.5 - ``NEUTRAL_BAND``; the clauses between are dropped."""
    other = {NEGATIVE: POSITIVE, POSITIVE: NEGATIVE}
    out = []
    for c, p in _scored(pool, scores):
        if not is_mild(c.text, language) or abs(p - 0.5) <= NEUTRAL_BAND:
            continue
        out.append(c if p > 0.5 else Clause(c.text, other[c.label], c.source, c.whole))
    return out


def _scored(pool: Sequence[Clause], scores: Sequence[float]) -> zip[tuple[Clause, float]]:
    if len(scores) != len(pool):
        raise UserError(f"{len(scores)} scores for {len(pool)} clauses; give one per clause")
    return zip(pool, scores)


def compose_turns(
    pool: Sequence[Clause],
    n: int,
    seed: int,
    language: str = "zh",
    held_out: Collection[str] = (),
    neutral_first: Sequence[str] = (),
    neutral_share: float = 0.0,
    conceded: Sequence[Clause] = (),
    concession_share: float = 0.0,
) -> LabeledCorpus:
    """``n`` turned examples (half ending positive, half negative; an odd one ends positive):
    a clause of one polarity, a turn, a clause of the other; labelled by the last clause. The
    first ``round(neutral_share * n)`` examples open with a clause of ``neutral_first`` instead
    (half of them, too, end positive). The last ``round(concession_share * n)`` run the other
    way: a clause of ``pool``, a turn of ``ZH_CONCEDE`` / ``EN_CONCEDE``, a clause of the other
    polarity from ``conceded`` (see :func:`concessions`), labelled by the first clause (half of
    them positive). Deterministic in ``seed``; no text repeats and none is in ``held_out``."""
    turns = ZH_TURNS if language == "zh" else EN_TURNS
    concede = ZH_CONCEDE if language == "zh" else EN_CONCEDE
    mild = {label: [c.text for c in conceded if c.label == label] for label in (NEGATIVE, POSITIVE)}
    by_label = {label: [c.text for c in pool if c.label == label] for label in (NEGATIVE, POSITIVE)}
    # a verdict is no mild clause itself
    verdicts = {label: [t for t in texts if not is_mild(t, language)]
                for label, texts in by_label.items()}  # fmt: skip
    if not 0 <= neutral_share <= 1:
        raise UserError(f"turn_neutral {neutral_share}: give a share in [0, 1]")
    if not 0 <= concession_share <= 1:
        raise UserError(f"turn_concessions {concession_share}: give a share in [0, 1]")
    n_neutral = round(neutral_share * n)
    n_conceded = round(concession_share * n)
    if n_neutral + n_conceded > n:
        raise UserError(
            f"turn_neutral {neutral_share} and turn_concessions {concession_share} ask for more "
            f"than all {n} turns: give shares that add up to at most 1"
        )
    if n_conceded and not all(mild.values()):
        raise UserError(
            f"turn_concessions needs mild clauses of both polarities; the scorer read "
            f"{len(mild[NEGATIVE])} negative and {len(mild[POSITIVE])} positive: give "
            "--turn-concessions 0, or more texts"
        )
    if n_neutral and not neutral_first:
        raise UserError(
            "turn_neutral asks for turns that open with a neutral clause, and the scorer read "
            "no clause as neutral: give --turn-neutral 0"
        )
    if n and not all(by_label.values()):
        raise UserError(
            f"composing turns needs clauses of both polarities; the pool has "
            f"{len(by_label[NEGATIVE])} negative and {len(by_label[POSITIVE])} positive: "
            "give --turns 0, or more texts of the missing polarity"
        )
    rng = random.Random(seed)
    ends = (" .",) if language == "en" else ("", "。")
    # distinct texts that end on one polarity: clause pairs x turns x endings
    per_label = len(by_label[NEGATIVE]) * len(by_label[POSITIVE]) * len(turns) * len(ends)
    if (n - n_neutral + 1) // 2 > per_label:
        raise UserError(
            f"{n - n_neutral} turned examples from {len(by_label[NEGATIVE])} negative and "
            f"{len(by_label[POSITIVE])} positive clauses would repeat; ask for at most "
            f"{2 * per_label}"
        )
    per_conceded = min(len(verdicts[a]) * len(mild[b]) for a, b in ((NEGATIVE, POSITIVE),
                       (POSITIVE, NEGATIVE))) * len(concede) * len(ends)  # fmt: skip
    if (n_conceded + 1) // 2 > per_conceded:
        raise UserError(
            f"{n_conceded} conceded turns from {len(mild[NEGATIVE])} negative and "
            f"{len(mild[POSITIVE])} positive mild clauses would repeat; ask for a smaller "
            f"--turn-concessions (at most {2 * per_conceded} of them)"
        )
    per_neutral = len(neutral_first) * min(map(len, by_label.values())) * len(turns) * len(ends)
    if (n_neutral + 1) // 2 > per_neutral:
        raise UserError(
            f"{n_neutral} turned examples from {len(neutral_first)} neutral clauses would "
            f"repeat; ask for a smaller --turn-neutral (at most {2 * per_neutral} of them)"
        )
    texts: list[str] = []
    labels: list[str] = []
    seen = set(held_out)
    for k in range(n):
        last = POSITIVE if k % 2 == 0 else NEGATIVE
        first = NEGATIVE if last == POSITIVE else POSITIVE
        firsts = neutral_first if k < n_neutral else by_label[first]
        conceding = k >= n - n_conceded
        for _ in range(MAX_DRAWS):
            if conceding:  # the verdict first, decides: ``last`` names the label
                a, b = rng.choice(verdicts[last]), rng.choice(mild[first])
                opener, turn = "", rng.choice(concede)
            else:
                a, b = rng.choice(firsts), rng.choice(by_label[last])
                opener, turn = rng.choice(turns)
            text = f"{opener}{a}{turn}{b}{rng.choice(ends)}"
            if text not in seen:
                break
        else:
            raise UserError(
                f"no new turned example after {MAX_DRAWS} draws ({k} of {n} made): the "
                "clauses are too few for this many; ask for fewer"
            )
        seen.add(text)
        texts.append(text)
        labels.append(last)
    stats = {
        "n": n,
        "clauses": {label: len(v) for label, v in by_label.items()},
        "seed": seed,
        "turns": ["…".join(t).strip() for t in turns],
    }
    if n_neutral:
        stats["neutral_first"] = n_neutral
    if n_conceded:
        stats["conceded"] = n_conceded
        stats["mild_clauses"] = {label: len(v) for label, v in mild.items()}
        stats["concede"] = [t.strip() for t in concede]
    return LabeledCorpus(texts, labels, source=f"turned sentences composed from {language} clauses "
                         "of the training split (augmentation)", stats=stats)  # fmt: skip


def count_for_share(share: float, n_train: int) -> int:
    """How many composed examples make ``share`` of a training set that has ``n_train`` others:
    n / (n_train + n) = share."""
    if not 0 <= share < 1:
        raise UserError(f"turn share {share}: give a share in [0, 1)")
    return round(share * n_train / (1 - share))
