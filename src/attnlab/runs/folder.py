"""The run directory: where it goes, who may write it (a lock), how it is created, its config.

* A new run is assembled in a hidden staging folder next to the target and renamed into place
  once its config and data files are written, so a failed start leaves nothing behind and two
  starts into one ``--out`` cannot mix their files: the second finds the folder taken.
* One process at a time writes a run directory: ``.lock`` holds an advisory ``flock`` for as long
  as the writer lives (the kernel drops it when the process dies, so a killed run never leaves
  a stale lock) and says who holds it (pid, host, start time).
* ``config.json`` records the task and the format of its layout; :func:`read_config` reads
  only the current layout and names the file in every error.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnlab.errors import UserError
from attnlab.runs.task import FORMAT

LOCK = ".lock"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"  # the run's best weights
QUANTIZED = "quantization.json"  # marks an int8 copy of a run (attnlab quantize)
PRUNED = "prune.json"  # marks a copy of a run with heads cut out (attnlab prune)
NAME_MAX = 255  # bytes of one folder name on Linux and macOS file systems


def check_not_quantized(run_dir: Path, doing: str) -> None:
    """Refuse a quantised run where a float one is needed (``doing`` names the action)."""
    if (run_dir / QUANTIZED).is_file():
        raise UserError(
            f"{run_dir} is already an int8-quantised run ({QUANTIZED}); {doing} needs the float "
            "run it was made from"
        )


def check_resumable(run_dir: Path) -> None:
    """Refuse to resume training in a folder made by quantize or prune: it holds a model
    derived from a run, no training state, and training there would overwrite its weights."""
    check_not_quantized(run_dir, "train --resume")
    if (run_dir / PRUNED).is_file():
        raise UserError(
            f"{run_dir} is a pruned copy of a run ({PRUNED}), not a training run; it cannot be "
            "resumed: train a new run, or resume the run it was pruned from"
        )


def is_main_process() -> bool:
    """Rank 0 under torchrun (or a plain process): the only one that writes run files."""
    return int(os.environ.get("RANK", "0")) == 0


def distributed() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def free_run_dir(base: Path) -> Path:
    """``base`` if it holds no run yet, else the first free ``base-2``, ``base-3``, ..."""
    if not base.exists():
        return base
    n = 2
    while (base.parent / f"{base.name}-{n}").exists():
        n += 1
    return base.parent / f"{base.name}-{n}"


def check_target(out: Path, resume: bool) -> None:
    """Refuse an --out that cannot hold this run, before anything is written."""
    longest = max([*out.parent.parts, staging_name(out)], key=lambda part: len(part.encode()))
    if len(longest.encode()) > NAME_MAX:
        name = out.name if longest == staging_name(out) else longest
        raise UserError(
            f"--out: the folder name {name[:40]}... is {len(name.encode())} bytes long; "
            f"give names of at most {NAME_MAX - 40} bytes"
        )
    if out.is_symlink() and not out.exists():
        raise UserError(
            f"--out {out} is a symbolic link to {os.readlink(out)}, which does not exist; "
            "remove the link or give another --out"
        )
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder; give a folder path for the run")
    existing = next(d for d in (out, *out.parents) if d.exists() or d == d.parent)
    if not existing.is_dir():
        raise UserError(
            f"--out {out}: {existing} is a file, so no folder can be made below it; "
            "give another --out"
        )
    has_run = (out / CONFIG).is_file()
    if resume and not has_run:
        raise UserError(f"--resume: {out} holds no run (no {CONFIG}); start one without --resume")
    if not resume and has_run:
        raise UserError(
            f"{out} already holds a run; pass --resume to continue it or choose another --out"
        )
    if not resume and out.is_dir() and any(out.iterdir()):
        raise UserError(
            f"--out {out} is a folder with other files in it; give a new or empty folder"
        )
    if not resume and out.is_dir() and out.is_mount():
        raise UserError(
            f"--out {out} is a mount point, which cannot be replaced by the run's folder; "
            f"give a folder inside it, e.g. --out {out / 'run'}"
        )
    writable = out if resume else (existing if existing != out else out.parent)
    if not os.access(writable, os.W_OK):
        fix = (
            f"copy the run to a writable place (cp -r {out} NEW) and resume that"
            if resume
            else "give an --out in a folder you can write to"
        )
        raise UserError(f"--out {out}: {writable} is not writable ({_why(writable)}); {fix}")


def _why(folder: Path) -> str:
    """'read-only file system' or 'permission denied', for a folder one cannot write."""
    try:
        read_only = os.statvfs(folder).f_flag & os.ST_RDONLY
    except OSError:
        read_only = False
    return "read-only file system" if read_only else "permission denied"


WRITE_ERRORS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG,
     errno.ENAMETOOLONG, errno.ENOTDIR, errno.EIO}
)  # fmt: skip


def write_failure(err: BaseException) -> str | None:
    """Why writing a run file failed, when ``err`` is the file system's refusal (disk full,
    read-only, no permission, ...) rather than a bug; None otherwise."""
    if isinstance(err, OSError) and err.errno in WRITE_ERRORS:
        return os.strerror(err.errno)
    if type(err).__name__ == "SafetensorError":  # safetensors' Rust IO error, as text
        text = str(err)
        for code in WRITE_ERRORS:
            if f"os error {code})" in text or os.strerror(code) in text:
                return os.strerror(code)
    return None


class RunLock:
    """An exclusive, process-lifetime lock on a run directory (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            if write_failure(err) is None:
                raise
            raise UserError(
                f"{self.path.parent} cannot be written ({err.strerror}); a run is trained and "
                "resumed in a writable folder: copy it somewhere writable, or choose another --out"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(
                f"{self.path.parent} is in use by another attnlab process ({holder(self.path)}); "
                "wait for it to finish or stop it, or choose another --out"
            ) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "start": _now()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(lock_path: Path) -> str:
    """Who holds a lock, from what it wrote: 'pid 123 on host, since 2026-...'."""
    try:
        info = json.loads(lock_path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "holder unknown"
    return f"pid {info.get('pid')} on {info.get('host')}, since {info.get('start')}"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())


def staging_name(out: Path, tag: str = "0" * 8) -> str:
    """The hidden folder a new run of ``out`` is assembled in (see :class:`Staging`)."""
    return f".{out.name}.starting-{os.getpid()}-{tag}"


def stale_staging(folder: Path, grace_s: float = 60.0) -> bool:
    """Whether a staging folder was left by a start that died (a kill -9 during start-up).

    Told by its lock, never by the pid in its name (process ids are reused, e.g. by a trainer
    that is process 1 of every container): a living start holds the flock on its ``.lock``. A
    folder whose lock is free is stale once the lock says who wrote it, or, with no holder
    written yet, once it is older than ``grace_s`` (a start between mkdir and locking)."""
    lock = folder / LOCK
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return _age(folder) > grace_s
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a living start holds it
    finally:
        os.close(fd)
    return lock.stat().st_size > 0 or _age(folder) > grace_s


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


class Staging:
    """A new run's files assembled in ``.{name}.starting-{pid}-{random}``, renamed to ``out``.

    Staging folders of ``out`` that earlier starts left behind (killed before they could clean
    up) are removed first, once their lock shows no process holds them."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.path = out.parent / staging_name(out, secrets.token_hex(4))
        self.lock = RunLock(self.path)

    def __enter__(self) -> Staging:
        for old in self.out.parent.glob(f".{glob.escape(self.out.name)}.starting-*"):
            if old.is_dir() and not old.is_symlink() and stale_staging(old):
                shutil.rmtree(old, ignore_errors=True)
        self.path.mkdir(parents=True)
        try:
            self.lock.acquire()  # the flock follows the folder through the rename
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        return self

    def publish(self) -> None:
        """Rename the staging folder to ``out`` (an existing empty ``out`` is replaced)."""
        try:
            if self.out.is_dir() and not any(self.out.iterdir()):
                self.out.rmdir()
            os.rename(self.path, self.out)
        except OSError as err:
            taken = self.out / LOCK
            if not (self.out / CONFIG).exists() and not taken.exists():
                mount = " (a mount point: give a folder inside it)" if self.out.is_mount() else ""
                raise UserError(
                    f"--out {self.out} cannot be created ({err.strerror}){mount}; "
                    "give another --out"
                ) from None
            who = f" ({holder(taken)})" if taken.exists() else ""
            raise UserError(
                f"{self.out} was taken by another run while this one started{who}; "
                "choose another --out"
            ) from None
        self.path = self.out
        self.lock.path = self.out / LOCK

    def discard(self) -> None:
        """Remove everything this start wrote (only ever the staging folder)."""
        self.lock.release()
        if self.path != self.out:
            shutil.rmtree(self.path, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self.discard()


# ---------------------------------------------------------------------------- config.json


def check_derived_out(source: Path, out: Path, verb: str) -> None:
    """Refuse an ``out`` for a copy of the run ``source`` that is the run or lies inside it
    (the copy would copy its own staging folder into itself)."""
    source, target = source.resolve(), out.resolve()
    if target == source or source in target.parents:
        raise UserError(
            f"--out {out} is inside the run {source} that {verb} copies; {verb} writes a new "
            "run folder: give an --out outside it"
        )


@contextlib.contextmanager
def derived_copy(source: Path, out: Path, skip: set[str]) -> Iterator[Path]:
    """A copy of the run ``source`` (less the names in ``skip``) assembled in a staging folder
    of its own, renamed to ``out`` (an empty ``out`` is replaced) when the block ends.

    The staging folder gets a fresh name beside ``out``, so no file of the user's is ever
    deleted or mixed in; on failure only it is removed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        shutil.copytree(
            source, staging, dirs_exist_ok=True, ignore=lambda d, names: skip & set(names)
        )
        yield staging
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_config(folder: Path, config: dict[str, Any]) -> None:
    """Write config.json atomically (temp file + rename)."""
    tmp = folder / (CONFIG + ".tmp")
    tmp.write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, folder / CONFIG)


def read_config(folder: str | Path) -> dict[str, Any]:
    """A run directory's config.json, refused in one line unless it has the current layout."""
    folder = Path(folder)
    path = folder / CONFIG
    if not folder.exists():
        raise UserError(f"{folder} does not exist; give the folder of a trained run")
    if not path.is_file():
        raise UserError(
            f"{folder} is not a run directory (no {CONFIG}); train one with `attnlab train TASK`"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:  # brackets nested past the parser's depth
        raise UserError(f"{path} is not valid JSON (nested too deep); restore it from a "
                        "backup") from None  # fmt: skip
    except (ValueError, OSError) as err:
        raise UserError(f"{path} is not valid JSON ({err}); restore it from a backup") from None
    if not isinstance(raw, dict) or "task" not in raw:
        raise UserError(f"{path} does not say which task made the run (no 'task' key)")
    if not isinstance(raw["task"], str):
        raise UserError(
            f"{path}: 'task' must name a task (a string such as \"classify\"), got "
            f"{json.dumps(raw['task'])[:40]}; restore the file from a backup"
        )
    version = raw.get("format", 1)  # the layout before the task registry had no "format" key
    if not isinstance(version, int) or isinstance(version, bool):
        raise UserError(
            f"{path}: 'format' must be a layout number such as {FORMAT}, got "
            f"{json.dumps(version)[:40]}; restore the file from a backup"
        )
    if version == FORMAT:
        return raw
    if version > FORMAT:
        raise UserError(
            f"{path} has config format {version}, newer than this attnlab reads ({FORMAT}); "
            "upgrade attnlab"
        )
    raise UserError(
        f"{path} has config format {version}, older than this attnlab reads ({FORMAT}); "
        "train the run again with this attnlab"
    )
