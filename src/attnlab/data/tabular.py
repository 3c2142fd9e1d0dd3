"""Load a user's labelled CSV, TSV or JSONL file into a `LabeledCorpus`, rejecting bad rows."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from attnlab.data.corpus import LabeledCorpus
from attnlab.data.errors import DataError
from attnlab.data.io import allow_long_csv_fields, clean_strings, is_blank, read_utf8
from attnlab.errors import UserError

FORMATS = ("csv", "tsv", "jsonl")
_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def load_labeled_file(
    path: str | os.PathLike[str],
    text_col: str = "text",
    label_col: str = "label",
    fmt: str | None = None,
) -> LabeledCorpus:
    """Read texts and string labels (any number of classes) from a CSV, TSV or JSONL file.

    The format comes from `fmt` or else the extension (.csv, .tsv/.tab, .jsonl/.ndjson). CSV and
    TSV need a header row naming the columns. Text and label are stripped of surrounding
    whitespace; blank lines are skipped (and counted in `stats`); any other bad row is an error
    naming the line, so no row is ever dropped silently.
    """
    path = Path(path)
    if text_col == label_col:
        raise DataError(
            path,
            f"the text and the label are the same column ({text_col!r})",
            "name the text column with --text-col and the label column with --label-col",
        )
    fmt = resolve_format(path, fmt)
    text = read_utf8(path)
    if not text.strip():
        raise DataError(
            path, "file is empty", f"add rows with a '{text_col}' and a '{label_col}' field"
        )
    if fmt == "jsonl":
        rows = jsonl_rows(path, text)
    else:
        fix = "pass text_col=/label_col= naming the right columns"
        _, rows = delimited_rows(path, text, "\t" if fmt == "tsv" else ",", (text_col, label_col),
                                 fix)  # fmt: skip

    texts: list[str] = []
    labels: list[str] = []
    origins: list[str] = []
    for line, row in rows:
        texts.append(_field(path, line, row, text_col, "text"))
        labels.append(_field(path, line, row, label_col, "label"))
        origins.append(f"{path}:{line}")
    if not texts:
        raise DataError(path, "file has a header but no data rows", "add at least one example")
    corpus = LabeledCorpus(texts, labels, source=str(path), origins=origins)
    corpus.stats = {
        "format": fmt,
        "rows": len(texts),
        "per_label": corpus.label_counts(),
        "duplicate_texts": len(texts) - len(set(texts)),
    }
    return corpus


def resolve_format(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise UserError(f"unknown format {fmt!r} for {path}; use one of {', '.join(FORMATS)}")
        return fmt
    suffix = path.suffix.lower()
    if suffix not in _EXTENSIONS:
        raise DataError(
            path,
            f"cannot tell the format from the extension {suffix!r}",
            "give a file ending in .csv, .tsv (.tab) or .jsonl (.ndjson), renamed if need be",
        )
    return _EXTENSIONS[suffix]


def _records(path: Path, text: str, delimiter: str) -> Iterator[tuple[int, int, list[str]]]:
    """Yield (first line, last line, fields) of each CSV record; bad quoting names its lines.

    The reader is strict: a field that opens with a quote must close it right before a
    separator or the end of the line, so an unbalanced quote is an error, never a guess.
    """
    allow_long_csv_fields()
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    start = 1
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise _quoting_error(path, err, start, reader.line_num, delimiter) from None
        yield start, reader.line_num, fields
        start = reader.line_num + 1


def _quoting_error(path: Path, err: csv.Error, start: int, end: int, delimiter: str) -> DataError:
    """What csv's terse message means for the record that began on line `start`."""
    name = "tab" if delimiter == "\t" else "comma"
    fix = 'close the quote, and write a quote inside a quoted field as two quotes ("")'
    if "unexpected end of data" in str(err):
        problem = (
            f'the quoted field opened on line {start} is never closed: an unbalanced quote (")'
            " swallows the rest of the file"
        )
        return DataError(path, problem, fix, line=start)
    if "expected after" in str(err):
        where = "" if end == start else f" (the quote opened on line {start})"
        problem = (
            f"a quoted field ends with a quote followed by more text instead of a {name}{where}"
            ": an unbalanced or undoubled quote"
        )
        return DataError(path, problem, fix, line=end)
    return DataError(path, f"malformed row ({err})", fix, line=start)


def delimited_rows(
    path: Path, text: str, delimiter: str, required: Sequence[str], column_fix: str
) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """The header of a CSV / TSV file and (first line number, {column: value}) of each
    non-blank data row; a column of ``required`` missing is refused with ``column_fix``."""
    records = _records(path, text, delimiter)
    name = "tab" if delimiter == "\t" else "comma"
    header: list[str] = []
    line = 0
    for start, _, fields in records:  # the first row with any content is the header
        header, line = [column.strip() for column in fields], start
        if any(header):
            break
    else:
        naming = " and ".join(repr(c) for c in required)
        raise DataError(path, "no header row", f"start with a row naming {naming}")
    for wanted in required:
        if wanted not in header:
            available = ", ".join(repr(c) for c in header)
            raise DataError(
                path,
                f"no column {wanted!r}; available columns: {available}",
                f"{column_fix}, or check that the file is {name}-separated",
                line=line,
            )
    duplicated = sorted({c for c in header if header.count(c) > 1})
    if duplicated:
        raise DataError(
            path, f"duplicate column names {duplicated}", "give each column a unique name", line
        )
    rows = []
    for start, end, fields in records:
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue
        if len(fields) != len(header):
            problem = f"expected {len(header)} {name}-separated fields, found {len(fields)}"
            fix = 'quote fields that contain the separator, e.g. "a, b"'
            if end > start:
                problem += f" in a row that runs inside quotes from line {start} to line {end}"
                fix = f'check line {start} for an unbalanced quote (")'
            raise DataError(path, problem, fix, line=start)
        rows.append((start, dict(zip(header, fields))))
    return header, rows


def jsonl_rows(path: Path, text: str) -> Iterator[tuple[int, dict[str, object]]]:
    """Yield (line number, object) for each non-blank line of a JSON-lines file."""
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = clean_strings(json.loads(line))  # a lone surrogate escape: U+FFFD
        except json.JSONDecodeError as err:
            raise DataError(
                path,
                f"bad JSON ({err.msg} at column {err.colno})",
                'write one JSON object per line, e.g. {"text": "...", "label": "..."}',
                line=number,
            ) from None
        if not isinstance(row, dict):
            raise DataError(
                path,
                f"expected a JSON object, found {type(row).__name__}",
                'write one JSON object per line, e.g. {"text": "...", "label": "..."}',
                line=number,
            )
        yield number, row


def _field(path: Path, line: int, row: dict, column: str, role: str) -> str:
    """Return the stripped string in `column`, or raise naming the line and the fix."""
    if column not in row:
        available = ", ".join(repr(c) for c in row)
        raise DataError(
            path,
            f"missing {role} field {column!r}; this line has: {available}",
            f"add a {column!r} field to every line, or pass {role}_col= naming the right key",
            line=line,
        )
    value = row[column]
    if isinstance(value, int) and not isinstance(value, bool) and role == "label":
        value = str(value)  # JSONL integer labels read like the same label in a CSV
    if not isinstance(value, str):
        raise DataError(
            path,
            f"{role} field {column!r} is {type(value).__name__}, not a string",
            f"store the {role} as a JSON string",
            line=line,
        )
    value = value.strip()
    if is_blank(value):
        fix = "fill in the text or delete the row" if role == "text" else "give the row a label"
        raise DataError(path, f"empty {role} in column {column!r}", fix, line=line)
    return value
