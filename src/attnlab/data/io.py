"""Reading UTF-8 text and writing files atomically, with errors that name file and line."""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnlab.data.errors import DataError
from attnlab.errors import UserError

# the file system's refusals of a write (as opposed to a bug); ENOENT: a folder on the path
# is missing, or takes no new file (a pseudo file system such as /proc)
WRITE_REFUSALS = frozenset(
    {errno.EISDIR, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT,
     errno.ENOTDIR, errno.ENAMETOOLONG, errno.EFBIG, errno.ENOENT}
)  # fmt: skip


def read_utf8(path: str | os.PathLike[str], what: str = "file") -> str:
    """Read a whole file as UTF-8 (a leading BOM is dropped); bad bytes raise with a line number.

    `what` names the file's kind in the error for a missing one ("no such tokenizer file").
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(path, f"no such {what}", "check the path") from None
    except IsADirectoryError:
        raise DataError(path, "is a directory, not a file", "pass the path of a file") from None
    except OSError as err:
        raise DataError(
            path, f"cannot read this {what} ({err.strerror})", "check its permissions"
        ) from None
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise DataError(
            path,
            "is UTF-16 text (it starts with a UTF-16 byte-order mark)",
            f"re-save it as UTF-8, e.g. `iconv -f UTF-16 -t UTF-8 {path} > {path.stem}.utf8"
            f"{path.suffix}`",
        )
    if b"\0" in raw[:8192]:
        raise DataError(
            path,
            f"is not a text file (it holds NUL bytes: binary data) but was given as a {what}",
            "pass a UTF-8 text file",
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise DataError(
            path,
            f"byte 0x{raw[err.start]:02x} at byte column {column} is not valid UTF-8",
            f"re-save the file with UTF-8 encoding ({_encoding_hint(raw)})",
            line=line,
        ) from None


def _encoding_hint(raw: bytes) -> str:
    """How to convert bytes that are not UTF-8: from the first legacy encoding that reads them."""
    for encoding, name in (
        ("gb18030", "GB18030"),
        ("shift_jis", "SHIFT_JIS"),
        ("cp1252", "CP1252"),
    ):
        try:
            raw.decode(encoding)
        except UnicodeDecodeError:
            continue
        return f"if it is {name}: `iconv -f {name} -t UTF-8`"
    return "find its encoding with `file -i`, then convert it with `iconv -f ENCODING -t UTF-8`"


ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e"))


def is_blank(text: str) -> bool:
    """Whether a text holds nothing to read: only whitespace and zero-width characters."""
    return not text.translate(ZERO_WIDTH).strip()


# A lone surrogate code point: a JSON escape such as "\\ud800", or a byte the command line
# could not decode as UTF-8 (Python keeps it as U+DC80..U+DCFF). No UTF-8 encoder accepts one.
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # how JSON writes one


def clean_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, the replacement character."""
    return _SURROGATE.sub("\ufffd", text)


def clean_strings(value: Any) -> Any:
    """A parsed JSON value with :func:`clean_text` applied to every string in it."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [clean_strings(v) for v in value]
    if isinstance(value, dict):
        return {clean_strings(k): clean_strings(v) for k, v in value.items()}
    return value


def read_stdin() -> str:
    """Standard input as text: bytes that are not UTF-8 become U+FFFD (whatever the locale)."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # replaced by a text stream (tests, embedding)
        return clean_text(sys.stdin.read())
    return buffer.read().decode("utf-8", errors="replace")


def split_lines(text: str) -> list[str]:
    """Lines ended by \\n, \\r\\n or a lone \\r (old Mac files, some terminals)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def read_json(
    path: str | os.PathLike[str],
    what: str,
    fix: str | None = None,
    keys: dict[str, type] | None = None,
) -> Any:
    """Parse a UTF-8 JSON file; errors are one line naming the file, its kind and the fix.

    `what` names the kind ("tokenizer", "run config"); `fix` replaces the default advice for a
    missing or broken file (e.g. "retrain into a new --out"). With `keys` ({name: type}), the
    file must hold a JSON object with those entries (valid JSON of the wrong shape is refused
    like broken JSON).
    """
    path = Path(path)
    if not path.exists():
        raise DataError(path, f"no such {what} file", fix or "check the path")
    text = read_utf8(path, f"{what} file")
    if not text.strip():
        raise DataError(path, f"the {what} file is empty", fix or f"regenerate the {what} file")
    try:
        value = json.loads(text)
        if _SURROGATE_ESCAPE.search(text):  # a lone surrogate escaped in a string: U+FFFD
            value = clean_strings(value)
    except json.JSONDecodeError as err:
        raise DataError(
            path,
            f"not a valid {what} JSON file ({err.msg}, column {err.colno})",
            fix or f"regenerate the {what} file instead of editing it by hand",
            line=err.lineno,
        ) from None
    except RecursionError:  # brackets nested past the parser's depth
        raise DataError(path, f"not a valid {what} JSON file (nested too deep)",
                        fix or f"regenerate the {what} file instead of editing it by hand",
                        ) from None  # fmt: skip
    shape = keys or {}
    if keys is not None and not (
        isinstance(value, dict)
        and all(
            isinstance(value.get(k), kind) and value[k] is not True for k, kind in shape.items()
        )
    ):
        want = ", ".join(f"{k} ({kind.__name__})" for k, kind in shape.items())
        found = {k: value.get(k) for k in shape} if isinstance(value, dict) else value
        raise DataError(
            path,
            f"not a {what} file: expected a JSON object{' with ' + want if want else ''}, "
            f"found {str(found)[:80]}",
            fix or f"regenerate the {what} file instead of editing it by hand",
        )
    return value


CSV_FIELD_LIMIT = 2**31 - 1  # the largest limit a C long takes on every platform


def allow_long_csv_fields() -> None:
    """Lift the csv module's default 131,072-character field limit (a long text is valid CSV).

    The limit is per process; call this before any `csv.reader` over user files.
    """
    if csv.field_size_limit() < CSV_FIELD_LIMIT:
        csv.field_size_limit(CSV_FIELD_LIMIT)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 text via a temporary file and rename, so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write `obj` as indented UTF-8 JSON (non-ASCII kept readable), atomically."""
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, indent=1) + "\n")


def check_file_target(path: Path, flag: str) -> None:
    """Refuse, before any work, an output file ``path`` that cannot become a file: a folder in
    its place, or a file where a folder above it must be."""
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder; give a file path")
    above = next(p for p in path.parents if p.exists())  # the nearest existing one above
    if not above.is_dir():
        raise UserError(f"{flag} {path}: {above} is a file, not a folder; give another path")


@contextlib.contextmanager
def output_errors(flag: str) -> Iterator[None]:
    """Turn the file system's refusal to write an output file (a folder in its place, a
    read-only folder, a full disk) into one line naming the file and the option to change."""
    try:
        yield
    except OSError as err:
        if err.errno not in WRITE_REFUSALS:
            raise
        raise UserError(
            f"cannot write {err.filename or 'the output file'} ({err.strerror}); "
            f"pass {flag} FILE in a folder you can write to"
        ) from None
