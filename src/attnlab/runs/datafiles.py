"""The data files a run was trained from: saved resolved, with a checksum, and found again.

A path typed on the command line (``--data data/small.csv``) means nothing once the user is in
another folder, so a new run saves each data path of its config absolute and records it in
``data_files.json`` with the path as given and a fingerprint of its content (sha256 of a file;
of the names and sizes below a folder). A run whose data was moved is found again when the path
as given, read from the current folder, the run's folder or its parent, has the same
fingerprint; otherwise the command that needs the data refuses it with a line saying what to
pass. Runs older than this record keep their paths as they were saved.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from attnlab.data.io import read_json, write_json
from attnlab.errors import UserError
from attnlab.runs.folder import CONFIG, WEIGHTS
from attnlab.runs.task import RunConfig

RECORD = "data_files.json"


def fingerprint(path: Path) -> str:
    """sha256 of a file's bytes, or of the relative names and sizes of a folder's files.

    A run folder (a distillation teacher) is fingerprinted by its weights' bytes: a teacher
    retrained in place keeps its file names and sizes, not its weights."""
    digest = hashlib.sha256()
    if path.is_dir() and (path / CONFIG).is_file() and (path / WEIGHTS).is_file():
        path = path / WEIGHTS
    if path.is_dir():
        for item in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(f"{item.relative_to(path)}\0{item.stat().st_size}\n".encode())
        return digest.hexdigest()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


Entry = tuple[str, Any, str, "int | None"]  # (record key, section, field, list position)


def _entries(
    cfg: RunConfig, names: Iterable[str], lists: Iterable[str] = ()
) -> Iterable[Entry]:
    """Every data path of ``cfg``'s fields ``names`` that holds a value: a field's own value,
    or each entry of a comma-separated field in ``lists`` (recorded as ``field[i]``)."""
    lists = set(lists)
    for section in cfg.sections.values():
        for name in names:
            value = getattr(section, name, None)
            if not value:
                continue
            if name in lists:
                for i, _ in enumerate(split_list(value)):
                    yield f"{name}[{i}]", section, name, i
            else:
                yield name, section, name, None


def split_list(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _get(section: Any, name: str, i: int | None) -> str:
    value = getattr(section, name)
    return value if i is None else split_list(value)[i]


def _set(section: Any, name: str, i: int | None, path: str) -> None:
    if i is None:
        setattr(section, name, path)
        return
    parts = split_list(getattr(section, name))
    parts[i] = path
    setattr(section, name, ",".join(parts))


def _field_of(key: str) -> tuple[str, int | None]:
    """``extra_train[1]`` -> ("extra_train", 1); ``data`` -> ("data", None)."""
    if key.endswith("]") and "[" in key:
        name, index = key[:-1].split("[", 1)
        return name, int(index)
    return key, None


def _recorded(cfg: RunConfig, key: str) -> tuple[Any, str, int | None] | None:
    """(section, field, list position) of a record key in ``cfg``, None when it has none."""
    name, i = _field_of(key)
    for section in cfg.sections.values():
        value = getattr(section, name, None)
        if value and (i is None or i < len(split_list(value))):
            return section, name, i
    return None


def resolve(
    cfg: RunConfig, names: Iterable[str], lists: Iterable[str] = ()
) -> dict[str, dict[str, str]]:
    """Make the data paths of a new run's config absolute; return their record.

    A value that names no existing file or folder (a bundled corpus such as ``pang_lee``) is
    left as it is: the task reports it."""
    record = {}
    for key, section, name, i in list(_entries(cfg, names, lists)):
        given = _get(section, name, i)
        path = Path(given).expanduser()
        if path.exists():
            full = path.resolve()
            _set(section, name, i, str(full))
            record[key] = {"path": str(full), "given": given, "sha256": fingerprint(full)}
    return record


def read_record(run_dir: Path) -> dict[str, dict[str, str]]:
    """The run's data_files.json ({} for runs made before it existed)."""
    path = run_dir / RECORD
    if not path.exists():
        return {}
    record = read_json(path, "data files record", "retrain into a new --out")
    ok = isinstance(record, dict) and all(
        isinstance(v, dict) and all(isinstance(v.get(k), str) for k in ("path", "given", "sha256"))
        for v in record.values()
    )
    if not ok:
        raise UserError(f"{path}: not an attnlab data files record; restore it or retrain")
    return record


def _candidates(entry: Mapping[str, str], run_dir: Path) -> list[Path]:
    given = Path(entry["given"]).expanduser()
    if given.is_absolute():
        return [given]
    return [Path.cwd() / given, run_dir.resolve().parent / given, run_dir.resolve() / given]


def relocate(cfg: RunConfig, run_dir: Path) -> None:
    """Point the config at data files that moved, when a candidate has the same content."""
    for key, entry in read_record(run_dir).items():
        found = _recorded(cfg, key)
        if found is None or Path(_get(*found)).exists():
            continue
        for candidate in _candidates(entry, run_dir):
            if candidate.exists() and fingerprint(candidate) == entry["sha256"]:
                _set(*found, str(candidate.resolve()))
                break


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def require(cfg: RunConfig, run_dir: Path, fix: str, skip: Iterable[str] = ()) -> None:
    """Refuse when a recorded data file is gone or changed; ``fix`` says what to do instead.
    Fields in ``skip`` are not needed by the caller and not checked."""
    for key, entry in read_record(run_dir).items():
        found = _recorded(cfg, key)
        if found is None or found[1] in skip:
            continue
        name = found[1]
        path = Path(_get(*found))
        if not path.exists():  # a file where it was typed, of other content, has changed
            path = next((c for c in _candidates(entry, run_dir) if c.is_file()), path)
        if not path.exists():
            raise UserError(
                f"the run's {flag(name)} file {path} is gone (moved or deleted; given as "
                f"{entry['given']!r}); {fix.format(flag=flag(name))}"
            )
        if fingerprint(path) != entry["sha256"]:
            raise UserError(
                f"the run's {flag(name)} file {path} has changed since the run was trained "
                f"(sha256 {entry['sha256'][:12]}... then); restore the original, or train a "
                "new run on the changed data"
            )


def unchanged(saved: str, given: str, is_list: bool) -> bool:
    """Whether a data path typed again on --resume names what the run saved: the same text,
    or a file that resolves to the saved path (each entry of a list, in order)."""
    if is_list:
        a, b = split_list(saved), split_list(given)
        return len(a) == len(b) and all(unchanged(x, y, False) for x, y in zip(a, b))
    if saved == given:
        return True
    path = Path(given).expanduser()
    return path.exists() and str(path.resolve()) == saved


def accept_moved(
    cfg: RunConfig, run_dir: Path, given: Mapping[str, str], lists: Iterable[str] = ()
) -> dict[str, dict[str, str]]:
    """On --resume, data paths typed again with other values: each must hold the very data the
    run was trained on (same fingerprint), wherever it now lives. Returns the updated record."""
    record = read_record(run_dir)
    lists = set(lists)
    for name, value in given.items():
        parts = split_list(value) if name in lists else [value]
        keys = [f"{name}[{i}]" for i in range(len(parts))] if name in lists else [name]
        saved = next((getattr(s, name) for s in cfg.sections.values() if hasattr(s, name)), "")
        if name in lists and len(parts) != len(split_list(saved)):
            raise UserError(
                f"{flag(name)} cannot change when resuming; start a new run to train on other data"
            )
        for key, part, old in zip(keys, parts, split_list(saved) if name in lists else [saved]):
            if unchanged(old, part, False):
                continue
            entry = record.get(key)
            path = Path(part).expanduser()
            if entry is None:
                raise UserError(
                    f"{flag(name)} cannot change when resuming; start a new run to train on "
                    "other data"
                )
            if not path.exists():
                raise UserError(f"{flag(name)} {part}: no such file or folder")
            if fingerprint(path) != entry["sha256"]:
                raise UserError(
                    f"{flag(name)} {part} is not the data this run was trained on (its sha256 "
                    f"differs); give the original file, or start a new run to train on other data"
                )
            found = _recorded(cfg, key)
            if found is not None:
                _set(*found, str(path.resolve()))
            record[key] = {**entry, "path": str(path.resolve())}
    return record


def write_record(run_dir: Path, record: Mapping[str, Any]) -> None:
    if record:
        write_json(run_dir / RECORD, dict(record))
