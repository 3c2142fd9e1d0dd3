"""The plan of `attnlab train classify`: what the data is, and which of the recipe's steps fit it.

The recipe's values (presets/classify.toml) were chosen on the bundled Chinese reviews. Before
any model work the run reads its data — the labels and their counts, the training size, the
language — and decides, by the rules below, which steps apply and with what value. It prints one
line per step, on or off and why. A value the user set (on the command line, or in a TOML file
of their own) is kept as given; one that cannot apply to the data is refused here, before the
frozen pass. The decisions are written back into the config, so config.json records what ran.

The rules:

- **blocks**: with a pretrained encoder, at most ``FULL_MAX`` training texts train every block
  at one rate (``FULL_LR``, no layer-wise decay), as full fine-tuning does; more keep the
  preset's top blocks on the frozen output of those below (the bundled recipe's 6,000 reviews).
  On 180-1,800 texts the top-4 recipe trailed full fine-tuning on all six datasets measured
  (docs/results/own_data.md), and at 4,050 and 5,400 on both measured, the bundled reviews
  (0/1) and the Bible's book genres (docs/results/blocks_threshold.md,
  blocks_threshold_6000.md).
- **sentiment pair**: the labels are ``positive`` / ``negative``, or two classes with
  ``--positive-label NAME`` naming the positive one. The steps made for sentiment (the English
  film sentences, composed turns) apply only to a pair, with their labels renamed to the data's
  own: they never change a run's classes.
- **extra sentiment sources** (``pang_lee``, ``imdb``, ``hownet``, ``dutir``): at most as many
  as the data's own training texts, so a small set is not swamped by another corpus; off when
  every block trains (they were measured as levers of the top-block recipe, and would double
  full fine-tuning's time).
- **turns**: Chinese or English text, a pretrained encoder, at most a third of the data's own
  training texts (the bundled recipe's 2,000 of 6,000); off when every block trains, as the
  extra sources are.
- **label cleaning**: two classes and at least ``MIN_CLEANING`` training texts, the setting it
  was measured in (docs/results/classify_e5.md): an out-of-fold probe on fewer texts, or on
  classes that overlap more, contradicts sound labels.
- **epochs**: enough that training sees ``SEEN_EXAMPLES`` examples (``SEEN_FULL`` when every
  block trains: two epochs of 1,800 texts), at least 1 and at most ``MAX_EPOCHS`` (the bundled
  recipe's one epoch of ~12,000 texts).
- **checkpoint**: chosen on validation macro-F1 when the largest class has more than
  ``IMBALANCE`` times the examples of the smallest, else on accuracy.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from attnlab.data.prepare import TextSplits
from attnlab.data.sentiment import EXTRA_NAMES, TWO_CLASSES, extra_names
from attnlab.data.turns import NEGATIVE, POSITIVE, clause_pool, language_of, sample_pool
from attnlab.errors import UserError
from attnlab.runs.task import RunConfig

MIN_CLEANING = 2000  # training texts label cleaning needs (measured at 6,000)
FULL_MAX = 5000  # training texts up to which every block trains (measured at 180-4,050)
FULL_LR = 3e-5  # full fine-tuning's one rate (classify_full.toml's)
SEEN_EXAMPLES = 8000  # examples an automatic number of epochs shows the model
SEEN_FULL = 3600  # the same when every block trains
MAX_EPOCHS = 10
IMBALANCE = 1.5  # largest / smallest class count above which macro-F1 chooses the checkpoint
TURN_SHARE = 3  # turns: at most one per this many of the data's own training texts
MIN_TURN_CLAUSES = 1  # clauses of each side a composition needs


@dataclass
class Decision:
    """One step of the recipe: whether it runs, with what value, and why."""

    step: str
    on: bool
    why: str
    value: Any = None

    def line(self) -> str:
        state = "on" if self.on else "off"
        shown = self.on and self.value is not None and self.value is not True
        value = f" ({self.value})" if shown else ""
        return f"{self.step}: {state}{value}: {self.why}"


@dataclass
class Plan:
    """What the data is and the decisions read from it."""

    labels: list[str]
    counts: dict[str, int]
    n_train: int
    language: str | None
    pair: dict[str, str] | None  # positive / negative -> the data's own label, or None
    decisions: list[Decision] = field(default_factory=list)

    @property
    def imbalance(self) -> float:
        return max(self.counts.values()) / max(1, min(self.counts.values()))

    def lines(self) -> list[str]:
        counts = ", ".join(f"{name} {n}" for name, n in self.counts.items())
        language = self.language or "mixed"
        head = (f"plan: {len(self.labels)} classes ({counts}) in {self.n_train} training texts, "
                f"language {language}")  # fmt: skip
        return [head, *(f"  {d.line()}" for d in self.decisions)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "labels": self.labels, "counts": self.counts, "n_train": self.n_train,
            "language": self.language, "sentiment_pair": self.pair,
            "steps": [{"step": d.step, "on": d.on, "value": d.value, "why": d.why}
                      for d in self.decisions],
        }  # fmt: skip


def sentiment_pair(labels: list[str], positive_label: str) -> dict[str, str] | None:
    """{positive: name, negative: name} in the data's labels, or None when they are no pair.
    A ``positive_label`` that is not one of two classes is refused."""
    if positive_label:
        if positive_label not in labels:
            raise UserError(f"--positive-label {positive_label!r} is not a label of the data; "
                            f"its labels are {labels}")  # fmt: skip
        if len(labels) != 2:
            raise UserError(f"--positive-label names one side of a pair; the data has "
                            f"{len(labels)} classes {labels}: drop --positive-label")  # fmt: skip
        other = next(name for name in labels if name != positive_label)
        return {POSITIVE: positive_label, NEGATIVE: other}
    if set(labels) == TWO_CLASSES:
        return {POSITIVE: POSITIVE, NEGATIVE: NEGATIVE}
    return None


def read_plan(cfg: RunConfig, texts: TextSplits, encoder: bool) -> Plan:
    """The plan for the run ``cfg`` on ``texts`` (split, no extra examples yet), its decisions
    written into ``cfg``; ``encoder``: a pretrained encoder reads the texts. The fields in
    ``cfg.given`` are kept (a resumed run's are all given); one the data cannot take is
    refused."""
    d, t, given = cfg.data, cfg.train, cfg.given
    train_texts, train_labels = texts.texts("train")
    counts = dict(sorted(Counter(train_labels).items()))
    language, _ = language_of(train_texts)
    pair = sentiment_pair(texts.labels.labels, d.positive_label)
    plan = Plan(texts.labels.labels, counts, len(train_texts), language, pair)
    n = plan.n_train
    full = False  # every block trains: the sentiment steps are off unless given
    if encoder:
        blocks = _blocks(d, t, plan, given)
        plan.decisions.append(blocks)
        full = blocks.value == "all"

    def no_pair(flag: str) -> str:
        """Why a sentiment step is off for labels that are no pair, and what turns it on."""
        why = f"the labels {plan.labels} are not a positive/negative pair"
        if len(plan.labels) == 2:
            why += f"; --positive-label NAME{f' with {flag}' if full and flag else ''} turns it on"
        return why

    # extra training examples: the named sentiment sources need a pair
    named = [s for s in extra_names(d.extra_train) if s in EXTRA_NAMES]
    files = [s for s in extra_names(d.extra_train) if s not in EXTRA_NAMES]
    if named and pair is not None and full and "extra_train" not in given:
        plan.decisions.append(Decision("extra_train", False, f"{', '.join(named)}: every block "
                                       "trains on the data's own texts; --extra-train "
                                       f"{','.join(named)} adds them"))  # fmt: skip
        d.extra_train = ",".join(files)
        named = []
    elif named and pair is None:
        if "extra_train" in given:
            raise UserError(f"--extra-train {','.join(named)} adds positive/negative examples; "
                            f"{no_pair('')}: drop them from --extra-train")  # fmt: skip
        why = no_pair(f"--extra-train {','.join(named)}")
        plan.decisions.append(Decision("extra_train", False, f"{', '.join(named)}: {why}"))
        d.extra_train = ",".join(files)
    elif named:
        why = "the labels are a sentiment pair"
        if not given & {"extra_train", "extra_train_examples"}:  # the preset's source
            d.extra_train_examples = min(d.extra_train_examples or n, n)
            why += "; at most as many as the data's own training texts"
        cap = d.extra_train_examples or "all"
        plan.decisions.append(Decision("extra_train", True, why, f"{', '.join(named)}: {cap}"))
    if files:
        plan.decisions.append(Decision("extra_train", True, "files given", ", ".join(files)))
    if not named and not files and not any(x.step == "extra_train" for x in plan.decisions):
        plan.decisions.append(Decision("extra_train", False, "none given"))

    if hasattr(d, "turns"):
        turns_pair = no_pair("" if "turns" in given else "--turns N")
        plan.decisions.append(_turns(d, texts, plan, encoder, given, turns_pair, full))
    if hasattr(d, "clean_labels"):
        plan.decisions.append(_cleaning(d, plan, given))
    if encoder:
        plan.decisions.append(_epochs(t, plan, d, given, full))
    plan.decisions.append(_monitor(t, plan, given))
    return plan


def _blocks(d: Any, t: Any, plan: Plan, given: frozenset[str]) -> Decision:
    if "train_layers" in given or d.train_layers <= 0:
        why = "as given" if "train_layers" in given else "the preset's"
        value = f"top {d.train_layers}" if d.train_layers else "all"
        return Decision("blocks", True, why, value)
    if plan.n_train > FULL_MAX:
        top = f"top {d.train_layers}"
        return Decision("blocks", True, f"more than {FULL_MAX} training texts: the {top} train on "
                        f"the frozen output of the blocks below, each block at {t.lr_decay:g} "
                        "of the rate above", top)  # fmt: skip
    d.train_layers = 0
    if "lr" not in given:
        t.lr = FULL_LR
    if "lr_decay" not in given:
        t.lr_decay = 1.0
    return Decision("blocks", True, f"at most {FULL_MAX} training texts: every block at lr "
                    f"{t.lr:g}, full fine-tuning; --train-layers N trains only the top N",
                    "all")  # fmt: skip


def _turns(
    d: Any, texts: TextSplits, plan: Plan, encoder: bool, given: frozenset[str], no_pair: str,
    full: bool,
) -> Decision:  # fmt: skip
    why = None
    if full and d.turns and "turns" not in given and plan.pair is not None:
        d.turns = 0
        return Decision("turns", False, "every block trains on the data's own texts; --turns N "
                        "adds them")  # fmt: skip
    if plan.pair is None:
        why = no_pair
    elif plan.language is None:
        why = "the training texts are neither mostly Chinese nor mostly English"
    elif not (encoder and d.pretrained):
        why = "their clauses are chosen by a probe on a pretrained encoder"
    if not d.turns:
        return Decision("turns", False, "--turns 0")
    if why is not None:
        if "turns" in given:
            raise UserError(f"--turns {d.turns}: {why}; give --turns 0")
        d.turns = 0
        return Decision("turns", False, why)
    sides = pool_sides(texts, plan, d.turn_clauses, d.split_seed)
    if min(sides.values()) < MIN_TURN_CLAUSES:
        why = (f"the training texts hold {sides[NEGATIVE]} negative and {sides[POSITIVE]} "
               f"positive clauses fit to be a side of a turn")  # fmt: skip
        if d.turn_clauses and "turn_clauses" in given:
            why += f" among the --turn-clauses {d.turn_clauses} sampled"
        if "turns" in given:
            fix = "a larger --turn-clauses or " if "turn_clauses" in given else ""
            raise UserError(f"--turns {d.turns}: {why}; give {fix}--turns 0")
        d.turns = 0
        return Decision("turns", False, why)
    cap = plan.n_train // TURN_SHARE
    if "turns" not in given and d.turns > cap:
        d.turns = cap
    if not d.turns:
        return Decision("turns", False, f"too few training texts ({plan.n_train}) to compose any")
    return Decision("turns", True, f"a sentiment pair in {plan.language}; at most one per "
                    f"{TURN_SHARE} training texts", d.turns)  # fmt: skip


def pool_sides(texts: TextSplits, plan: Plan, n: int, seed: int) -> Counter[str]:
    """How many clauses of each side the composition may draw from: the qualifying clauses of
    the corpus's own training texts, sampled to ``n`` as the step samples them."""
    assert plan.pair is not None and plan.language is not None
    polarity = {name: side for side, name in plan.pair.items()}
    own, labels = texts.texts("train")
    pool = clause_pool(own, [polarity[y] for y in labels], plan.language)
    sides = Counter({NEGATIVE: 0, POSITIVE: 0})
    sides.update(c.label for c in sample_pool(pool, n, seed))
    return sides


def _cleaning(d: Any, plan: Plan, given: frozenset[str]) -> Decision:
    if not d.clean_labels:
        return Decision("label cleaning", False, "--clean-labels 0")
    fits = len(plan.labels) == 2 and plan.n_train >= MIN_CLEANING
    if not fits and "clean_labels" not in given:
        d.clean_labels = 0.0
        return Decision("label cleaning", False, f"measured on two classes and at least "
                        f"{MIN_CLEANING} training texts; --clean-labels P turns it on")  # fmt: skip
    return Decision("label cleaning", True, "drops texts the other folds' probe reads as another "
                    "class", f"p < {d.clean_labels:g}")  # fmt: skip


def _epochs(t: Any, plan: Plan, d: Any, given: frozenset[str], full: bool) -> Decision:
    if t.max_steps:
        return Decision("epochs", True, "--max-steps sets the length", f"{t.max_steps} steps")
    if "epochs" in given:
        return Decision("epochs", True, "as given", t.epochs)
    extra = d.extra_train_examples if extra_names(d.extra_train) else 0
    n = plan.n_train + extra + getattr(d, "turns", 0)
    seen = SEEN_FULL if full else SEEN_EXAMPLES
    t.epochs = max(1, min(MAX_EPOCHS, math.ceil(seen / max(1, n))))
    return Decision("epochs", True, f"enough to see {seen} examples of about {n} "
                    f"(at most {MAX_EPOCHS})", t.epochs)  # fmt: skip


def _monitor(t: Any, plan: Plan, given: frozenset[str]) -> Decision:
    if "monitor" in given:
        return Decision("checkpoint", True, "as given", t.monitor)
    if plan.imbalance > IMBALANCE and t.monitor.endswith("_acc"):
        t.monitor, t.monitor_mode = t.monitor[: -len("acc")] + "macro_f1", "max"
        why = (f"the classes are imbalanced (largest / smallest {plan.imbalance:.1f} > "
               f"{IMBALANCE}): the best validation macro-F1")  # fmt: skip
    else:
        why = f"the best {t.monitor.replace('_', ' ')}"
    return Decision("checkpoint", True, why, t.monitor)
