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


def _fields(cfg: RunConfig, names: Iterable[str]) -> Iterable[tuple[Any, str]]:
    """(section, field name) of every data-path field of ``cfg`` that holds a value."""
    for section in cfg.sections.values():
        for name in names:
            if getattr(section, name, None):
                yield section, name


def resolve(cfg: RunConfig, names: Iterable[str]) -> dict[str, dict[str, str]]:
    """Make the data paths of a new run's config absolute; return their record.

    A value that names no existing file or folder (a bundled corpus such as ``pang_lee``) is
    left as it is: the task reports it."""
    record = {}
    for section, name in _fields(cfg, names):
        given = getattr(section, name)
        path = Path(given).expanduser()
        if path.exists():
            full = path.resolve()
            setattr(section, name, str(full))
            record[name] = {"path": str(full), "given": given, "sha256": fingerprint(full)}
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
    for name, entry in read_record(run_dir).items():
        for section, field in _fields(cfg, [name]):
            if Path(getattr(section, field)).exists():
                continue
            for candidate in _candidates(entry, run_dir):
                if candidate.exists() and fingerprint(candidate) == entry["sha256"]:
                    setattr(section, field, str(candidate.resolve()))
                    break


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def require(cfg: RunConfig, run_dir: Path, fix: str, skip: Iterable[str] = ()) -> None:
    """Refuse when a recorded data file is gone or changed; ``fix`` says what to do instead.
    Fields in ``skip`` are not needed by the caller and not checked."""
    for name, entry in read_record(run_dir).items():
        if name in skip:
            continue
        for section, field in _fields(cfg, [name]):
            path = Path(getattr(section, field))
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


def accept_moved(
    cfg: RunConfig, run_dir: Path, given: Mapping[str, str]
) -> dict[str, dict[str, str]]:
    """On --resume, data paths typed again: each must hold the very data the run was trained
    on (same fingerprint), wherever it now lives. Returns the updated record."""
    record = read_record(run_dir)
    for name, value in given.items():
        entry = record.get(name)
        path = Path(value).expanduser()
        if entry is None:
            raise UserError(
                f"{flag(name)} cannot change when resuming; start a new run to train on other data"
            )
        if not path.exists():
            raise UserError(f"{flag(name)} {value}: no such file or folder")
        if fingerprint(path) != entry["sha256"]:
            raise UserError(
                f"{flag(name)} {value} is not the data this run was trained on (its sha256 "
                f"differs); give the original file, or start a new run to train on other data"
            )
        for section, field in _fields(cfg, [name]):
            setattr(section, field, str(path.resolve()))
        record[name] = {**entry, "path": str(path.resolve())}
    return record


def write_record(run_dir: Path, record: Mapping[str, Any]) -> None:
    if record:
        write_json(run_dir / RECORD, dict(record))
