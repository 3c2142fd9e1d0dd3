"""Score a CSV, TSV or JSONL file with a classifier, resumably.

Every input column is kept and the run's answer is added: ``predicted_label`` and one
``prob_<class>`` column per class. Rows are written in chunks, each flushed to the disk before
the next is scored, so a run killed part way leaves OUT holding whole rows plus at most one
cut-off row. ``resume`` reads OUT back, checks that each whole row's input columns are the
input's rows in order (a different input is refused), drops a cut-off tail and scores from the
first row OUT lacks: no row is scored twice or lost.

The input is read and checked whole before anything is written (a missing column, an empty
text, a file that is not UTF-8: one line naming the file, the line and the fix), so a bad file
leaves no OUT behind. Blank lines are not rows (as for training files).
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.data.errors import DataError
from attnlab.data.io import check_file_target, is_blank, read_utf8
from attnlab.data.tabular import delimited_rows, jsonl_rows, resolve_format
from attnlab.errors import UserError

LABEL_COLUMN = "predicted_label"
PROB_PREFIX = "prob_"
CHUNK = 1024  # rows scored, written and flushed at a time
Predict = Callable[[list[str]], list[dict[str, Any]]]


@dataclass
class Table:
    """An input file read whole: its columns (first-seen order), rows, their lines and texts."""

    path: Path
    fmt: str
    columns: list[str]
    rows: list[dict[str, Any]]
    lines: list[int]
    texts: list[str]


def read_table(path: str | os.PathLike[str], text_col: str) -> Table:
    """The rows of a CSV, TSV or JSONL file (format from the extension) and the texts of
    ``text_col``; a missing column or an empty or non-string text is a DataError."""
    path = Path(path)
    fmt = resolve_format(path, None)
    raw = read_utf8(path, "data file")
    if not raw.strip():
        raise DataError(path, "file is empty", f"add rows with a {text_col!r} column")
    if fmt == "jsonl":
        numbered = list(jsonl_rows(path, raw))
        columns: list[str] = []
        for _, row in numbered:
            columns += [key for key in row if key not in columns]
    else:
        fix = "pass --text-col naming the text column"
        columns, numbered = delimited_rows(path, raw, "\t" if fmt == "tsv" else ",", (text_col,),
                                           fix)  # fmt: skip
    if not numbered:
        raise DataError(path, "file has no data rows", "add at least one row to score")
    texts = []
    for line, row in numbered:
        if text_col not in row:
            have = ", ".join(repr(c) for c in row)
            fix = "pass --text-col naming the column that holds the text"
            raise DataError(path, f"no column {text_col!r}; this row has: {have}", fix, line)
        value = row[text_col]
        if not isinstance(value, str):
            raise DataError(path, f"{text_col!r} is {type(value).__name__}, not a string",
                            "store the text as a JSON string", line)  # fmt: skip
        if is_blank(value):
            raise DataError(path, f"empty text in column {text_col!r}",
                            "fill in the text or delete the row", line)  # fmt: skip
        texts.append(value)
    return Table(path, fmt, columns, [r for _, r in numbered], [n for n, _ in numbered], texts)


class Writer:
    """How OUT's header and rows are written (its format from its extension)."""

    def __init__(self, path: Path, columns: list[str], labels: Sequence[str]) -> None:
        self.fmt = resolve_format(path, None)
        self.added = [LABEL_COLUMN] + [PROB_PREFIX + label for label in labels]
        clash = sorted(set(self.added) & set(columns))
        if clash:
            raise UserError(
                f"the input already has column(s) {clash}, which predict adds; rename them"
            )
        self.columns = list(columns) + self.added
        self.labels = list(labels)

    def header(self) -> str:
        return "" if self.fmt == "jsonl" else self._line(self.columns)

    def row(self, row: dict[str, Any], pred: dict[str, Any]) -> str:
        added: dict[str, Any] = {LABEL_COLUMN: pred["label"]}
        added |= {PROB_PREFIX + k: round(pred["probs"][k], 6) for k in self.labels}
        if self.fmt == "jsonl":
            return json.dumps(row | added, ensure_ascii=False) + "\n"
        return self._line([_cell(row.get(c, "")) for c in self.columns[: -len(self.added)]]
                          + [_cell(added[c]) for c in self.added])  # fmt: skip

    def _line(self, fields: list[str]) -> str:
        buffer = io.StringIO()
        delimiter = "\t" if self.fmt == "tsv" else ","
        csv.writer(buffer, delimiter=delimiter, lineterminator="\n").writerow(fields)
        return buffer.getvalue()

    def inputs_of(self, record: Any) -> Any:
        """The input part of a row read back from OUT, as :meth:`expected` gives it."""
        if self.fmt == "jsonl":
            return {k: v for k, v in record.items() if k not in self.added}
        return record[: -len(self.added)]

    def expected(self, row: dict[str, Any]) -> Any:
        """The input part of the row OUT holds for input row ``row``."""
        if self.fmt == "jsonl":
            return row
        return [_cell(row.get(c, "")) for c in self.columns[: -len(self.added)]]


def _cell(value: Any) -> str:
    """A value as a CSV cell: strings as they are, other JSON values as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def rows_done(out: Path, table: Table, writer: Writer) -> int:
    """How many whole rows OUT holds of ``table``, OUT cut back to just them (a row cut off
    by a kill is dropped); a UserError when OUT's rows are not the input's."""
    raw = out.read_bytes()
    refuse = (f"{out} does not hold the rows of {table.path} (or was edited); pass another "
              "--out, or delete it to start over")  # fmt: skip
    try:  # a cut-off last line never counts (it may end inside a character)
        kept = raw[: raw.rfind(b"\n") + 1].decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{refuse}: it is not UTF-8") from None
    header = writer.header()
    if not kept.startswith(header):
        if header.encode("utf-8").startswith(raw):  # killed while writing the header
            _truncate(out, 0)
            return 0
        raise UserError(f"{refuse}: its header is not {writer.columns}")
    body = kept[len(header) :]
    done, good = 0, len(header)
    for record, size in _read_back(body, writer):
        if done >= len(table.rows):
            raise UserError(f"{refuse}: it holds more rows than the input's {len(table.rows)}")
        if writer.inputs_of(record) != writer.expected(table.rows[done]):
            raise UserError(f"{refuse}: its row {done + 1} differs from line "
                            f"{table.lines[done]} of the input")  # fmt: skip
        done, good = done + 1, good + size
    _truncate(out, len(kept[:good].encode("utf-8")))
    return done


def _read_back(body: str, writer: Writer) -> Any:
    """Yield (record, characters) of each whole row in ``body`` (OUT after its header), until
    the first that is cut off or malformed."""
    if writer.fmt == "jsonl":
        for line in body.split("\n")[:-1]:  # not splitlines: a text may hold U+2028
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                return
            if not isinstance(record, dict) or LABEL_COLUMN not in record:
                return
            yield record, len(line) + 1
        return
    delimiter = "\t" if writer.fmt == "tsv" else ","
    reader = csv.reader(io.StringIO(body, newline=""), delimiter=delimiter, strict=True)
    while True:
        try:
            fields = next(reader)
        except (StopIteration, csv.Error):  # the end, or a quoted text cut off in its middle
            return
        line = writer._line(fields)
        if len(fields) != len(writer.columns) or not body.startswith(line):
            return
        body = body[len(line) :]
        yield fields, len(line)


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(size)


def score_file(
    predict: Predict,
    labels: Sequence[str],
    data: str | os.PathLike[str],
    out: str | os.PathLike[str],
    text_col: str = "text",
    resume: bool = False,
    progress: bool = True,
    chunk: int = CHUNK,
) -> dict[str, Any]:
    """Score every row of ``data`` into ``out`` (see the module's docstring); returns
    {rows, scored, resumed, seconds, texts_per_s, out, longer_than_training}."""
    out = Path(out)
    table = read_table(data, text_col)
    if out.resolve() == table.path.resolve():
        raise UserError(f"--out {out} is the input file; give another path")
    check_file_target(out, "--out")
    writer = Writer(out, table.columns, labels)
    if out.exists() and not resume:
        raise UserError(f"{out} exists; pass --resume to continue scoring into it, or another "
                        "--out")  # fmt: skip
    done = rows_done(out, table, writer) if resume and out.exists() else 0
    from tqdm import tqdm

    start = time.perf_counter()
    longer = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8", newline="") as handle, tqdm(
        total=len(table.rows), initial=done, unit="text", file=sys.stderr,
        disable=not progress, desc=f"scoring {table.path.name}", smoothing=0.1,
    ) as bar:  # fmt: skip
        if handle.tell() == 0:
            handle.write(writer.header())
        for first in range(done, len(table.rows), chunk):
            rows = range(first, min(first + chunk, len(table.rows)))
            preds = predict([table.texts[i] for i in rows])
            longer += sum(bool(p.get("longer_than_training")) for p in preds)
            handle.write("".join(writer.row(table.rows[i], p) for i, p in zip(rows, preds)))
            handle.flush()
            os.fsync(handle.fileno())
            bar.update(len(rows))
    seconds = time.perf_counter() - start
    scored = len(table.rows) - done
    return {"rows": len(table.rows), "scored": scored, "resumed": done, "seconds": seconds,
            "texts_per_s": scored / seconds if seconds > 0 else 0.0, "out": str(out),
            "longer_than_training": longer}  # fmt: skip
