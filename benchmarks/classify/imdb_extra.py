"""The IMDB lever of the main job: English film reviews beside Pang & Lee's sentences.

Writes one CSV (text, label) for ``attnlab train classify --extra-train FILE
--extra-train-examples 0``: the class-balanced sample of Pang & Lee's sentences the default
draws (``--pang-lee`` of them, split seed 0, as ``extra_train_examples`` draws them) followed by
a class-balanced ``--imdb`` of the IMDB reviews (seed 0), each read as ``--part``:

``head``    the whole review (``<br />`` breaks as spaces); training then reads its first 128
            pieces, mostly the plot;
``ending``  the review's last whole sentences, at most ``ENDING_CHARS`` characters (one
            sentence when the last is longer): where a review usually gives its verdict.

Main_job.md's IMDB rows are `attnlab train classify` runs on these files:

    python -m benchmarks.classify.imdb_extra --part ending --out /tmp/imdb/pl_imdb1000_tail.csv
    python -m benchmarks.classify.imdb_extra --part head --out /tmp/imdb/pl_imdb1000_head.csv
    python -m benchmarks.classify.imdb_extra --part ending --pang-lee 4000 \
        --out /tmp/imdb/pl4000_imdb1000_tail.csv
"""

from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path

ENDING_CHARS = 400
_BREAK = re.compile(r"<br\s*/?>")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("head", "ending"), required=True)
    p.add_argument("--imdb", type=int, default=1000, help="IMDB reviews, class-balanced")
    p.add_argument("--pang-lee", type=int, default=2000, help="Pang & Lee sentences first")
    p.add_argument("--out", type=Path, required=True)
    return p


def head(review: str) -> str:
    """The whole review, its HTML line breaks as spaces."""
    return _BREAK.sub(" ", review)


def ending(review: str, chars: int = ENDING_CHARS) -> str:
    """The review's last whole sentences, at most ``chars`` characters (at least one)."""
    sentences = _SENTENCE_END.split(head(review).strip())
    kept: list[str] = []
    for sentence in reversed(sentences):
        if kept and sum(len(s) for s in kept) + len(sentence) > chars:
            break
        kept.insert(0, sentence)
    return " ".join(kept)


def main(argv: list[str] | None = None) -> None:
    from attnlab.data.sentiment import balanced_subsample, extra_examples, read_corpus

    args = parser().parse_args(argv)
    pang_lee, _ = extra_examples("pang_lee", {"negative", "positive"}, set(), n=args.pang_lee)
    imdb = balanced_subsample(read_corpus("imdb", "text", "label"), args.imdb, 0)
    part = head if args.part == "head" else ending
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(zip(pang_lee.texts, pang_lee.labels))
        writer.writerows((part(t), y) for t, y in zip(imdb.texts, imdb.labels))
    mean = sum(len(part(t)) for t in imdb.texts) / max(len(imdb), 1)
    print(f"{args.out}: {len(pang_lee)} Pang & Lee sentences, {len(imdb)} IMDB reviews "
          f"({args.part}, {mean:.0f} characters on average)")  # fmt: skip


if __name__ == "__main__":
    main()
