"""Load a user's labelled CSV, TSV or JSONL file into a `LabeledCorpus`, rejecting bad rows."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

from attnlab.data.corpus import LabeledCorpus
from attnlab.data.errors import DataError
from attnlab.data.io import read_utf8

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
    fmt = _resolve_format(path, fmt)
    text = read_utf8(path)
    if not text.strip():
        raise DataError(
            path, "file is empty", f"add rows with a '{text_col}' and a '{label_col}' field"
        )
    if fmt == "jsonl":
        rows = _jsonl_rows(path, text)
    else:
        rows = _delimited_rows(path, text, "\t" if fmt == "tsv" else ",", text_col, label_col)

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


def _resolve_format(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r} for {path}; use one of {', '.join(FORMATS)}")
        return fmt
    suffix = path.suffix.lower()
    if suffix not in _EXTENSIONS:
        raise DataError(
            path,
            f"cannot tell the format from the extension {suffix!r}",
            f"rename the file or pass fmt= one of {', '.join(FORMATS)}",
        )
    return _EXTENSIONS[suffix]


def _delimited_rows(
    path: Path, text: str, delimiter: str, text_col: str, label_col: str
) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (first line number, {column: value}) for each non-blank data row."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    name = "tab" if delimiter == "\t" else "comma"
    try:
        header: list[str] = []
        for fields in reader:  # the first row with any content is the header
            header = [column.strip() for column in fields]
            if any(header):
                break
        else:
            raise DataError(
                path, "no header row", f"start with a row naming {text_col!r} and {label_col!r}"
            )
        for wanted in (text_col, label_col):
            if wanted not in header:
                available = ", ".join(repr(c) for c in header)
                raise DataError(
                    path,
                    f"no column {wanted!r}; available columns: {available}",
                    f"pass text_col=/label_col= naming the right columns, or check that the "
                    f"file is {name}-separated",
                    line=reader.line_num,
                )
        duplicated = sorted({c for c in header if header.count(c) > 1})
        if duplicated:
            raise DataError(
                path,
                f"duplicate column names {duplicated}",
                "give each column a unique name",
                reader.line_num,
            )
        line = reader.line_num + 1
        for fields in reader:
            start, line = line, reader.line_num + 1
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue
            if len(fields) != len(header):
                raise DataError(
                    path,
                    f"expected {len(header)} {name}-separated fields, found {len(fields)}",
                    'quote fields that contain the separator, e.g. "a, b"',
                    line=start,
                )
            yield start, dict(zip(header, fields))
    except csv.Error as err:
        raise DataError(
            path, f"malformed row ({err})", "fix the quoting on this line", line=reader.line_num
        ) from None


def _jsonl_rows(path: Path, text: str) -> Iterator[tuple[int, dict[str, object]]]:
    """Yield (line number, object) for each non-blank line of a JSON-lines file."""
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
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
    if not value:
        fix = "fill in the text or delete the row" if role == "text" else "give the row a label"
        raise DataError(path, f"empty {role} in column {column!r}", fix, line=line)
    return value
