"""Run folders under misuse: start-up kills, stale staging folders, --out targets
that cannot hold a run, a disk that fills up, read-only folders. Each probe: one line on
stderr, exit 2, no traceback, nothing left behind, nothing of an earlier run changed."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import TINY, probe, snapshot, train, write_corpus

from attnlab.cli import main
from attnlab.runs import folder

HOLD_STAGING = (
    "import sys, time\nfrom pathlib import Path\nfrom attnlab.runs.folder import Staging\n"
    "s = Staging(Path(sys.argv[1])).__enter__()\nprint(s.path, flush=True)\ntime.sleep(60)"
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("data") / "reviews.csv")


def hold_staging(out: Path) -> tuple[subprocess.Popen, Path]:
    """A process in the middle of a start of ``out`` (its staging folder made and locked)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_STAGING, str(out)], stdout=subprocess.PIPE, text=True
    )
    staging = Path(proc.stdout.readline().strip())
    assert staging.name.startswith(f".{out.name}.starting-"), staging
    return proc, staging


# ---------------------------------------------------------------------------- start-up kills


def test_a_start_killed_during_start_up_is_cleaned_by_the_next(tmp_path, corpus) -> None:
    out = tmp_path / "R"
    proc, staging = hold_staging(out)
    proc.kill()  # kill -9 during start-up: the staging folder stays behind
    proc.wait()
    assert staging.is_dir() and folder.stale_staging(staging)
    assert train(out, corpus, "--max-steps", "2", "--eval-every", "2") == 0
    assert not list(tmp_path.glob(".R.starting-*")), "the stale staging folder is removed"
    assert (out / "config.json").is_file()


def test_stale_staging_is_told_by_its_lock_not_its_pid(tmp_path, corpus) -> None:
    """The pid-reuse case: a stale folder named after this very process (as when the trainer
    is process 1 of every container) is cleaned; a living start's folder is left alone."""
    out = tmp_path / "R"
    mine = tmp_path / f".R.starting-{os.getpid()}"  # the layout of older attnlab versions
    mine.mkdir()
    (mine / ".lock").write_text(json.dumps({"pid": os.getpid(), "host": "h", "start": "t"}))
    (mine / "config.json").write_text("{}")
    proc, living = hold_staging(tmp_path / "R")
    try:
        assert not folder.stale_staging(living)
        assert train(out, corpus, "--max-steps", "2", "--eval-every", "2") == 0
        assert not mine.exists()
        assert living.is_dir(), "a start in progress keeps its folder"
    finally:
        proc.kill()
        proc.wait()
    empty = tmp_path / ".S.starting-7"  # a start killed between mkdir and its lock
    empty.mkdir()
    assert not folder.stale_staging(empty)  # young: could be a start about to lock it
    os.utime(empty, (0, 0))
    assert folder.stale_staging(empty)


# ---------------------------------------------------------------------------- --out targets


def test_outs_that_cannot_hold_a_run_give_one_line(tmp_path, corpus, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    args = ["train", "classify", "--data", str(corpus), *TINY, "--out"]
    probe(capsys, [*args, str(afile / "sub" / "run")], "afile is a file", "below it")
    probe(capsys, [*args, str(link)], "symbolic link", "does not exist")
    probe(capsys, [*args, str(tmp_path / ("x" * 300))], "300 bytes long")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "link"]


# ---------------------------------------------------------------------------- disk full


@contextlib.contextmanager
def tmpfs(where: Path, size: str, options: str = ""):
    """A small tmpfs at ``where`` (skips where this machine cannot mount one)."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}{options}", "tmpfs", str(where)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the ENOSPC probes below still run")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path, leave: int) -> Path:
    """Fill the file system of ``where`` until about ``leave`` bytes are free."""
    free = os.statvfs(where).f_bavail * os.statvfs(where).f_frsize
    filler = where / "filler"
    with open(filler, "wb") as handle:
        handle.write(b"\0" * max(free - leave, 0))
    return filler


def test_a_full_disk_at_start_at_the_first_checkpoint_and_mid_run(tmp_path, corpus, capsys):
    """On a real (tiny) tmpfs: each failure is one line, a failed start leaves nothing, a failed
    run keeps its last whole checkpoint and resumes once there is space."""
    with tmpfs(tmp_path / "disk", "4m") as disk:
        run, steps = disk / "run", ["--eval-every", "3", "--checkpoint-every", "3"]
        argv = ["train", "classify", "--out", str(run), "--data", str(corpus), *TINY, *steps]
        filler = fill(disk, 8 * 1024)  # at start: not even the split and tokenizer fit
        probe(capsys, [*argv, "--max-steps", "3"], "No space left", "nothing was kept")
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]
        filler.unlink()
        # the first checkpoint: the run's start files fit, its weights do not
        filler = fill(disk, 64 * 1024)
        err = probe(capsys, [*argv, "--max-steps", "3"], "No space left", after_training=True)
        assert "no checkpoint yet" in err and "--resume" in err
        assert not (run / "state.tmp").exists()
        filler.unlink()
        assert main([*argv, "--resume", "--max-steps", "3"]) == 0
        before = json.loads((run / "state" / "trainer.json").read_text())["loop"]["step"]
        # mid-run: the next checkpoint does not fit beside the last one
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        state_size = sum(p.stat().st_size for p in (run / "state").iterdir())
        filler = fill(disk, state_size // 2)
        assert free > state_size
        err = probe(capsys, [*argv, "--resume", "--max-steps", "6"], "No space left",
                    after_training=True)  # fmt: skip
        assert f"last checkpoint (step {before}) is kept" in err
        assert not (run / "state.tmp").exists()
        filler.unlink()
        capsys.readouterr()
        assert main(["train", "classify", "--out", str(run), "--resume", "--max-steps", "6"]) == 0
        assert json.loads((run / "summary.json").read_text())["steps"] == 6


def test_a_read_only_mount_point_as_out(tmp_path, corpus, capsys) -> None:
    with tmpfs(tmp_path / "mnt", "1m", ",ro") as mnt:
        argv = ["train", "classify", "--data", str(corpus), *TINY, "--out"]
        probe(capsys, [*argv, str(mnt)], "mount point", "give a folder inside it")
        probe(capsys, [*argv, str(mnt / "run")], "not writable", "read-only file system")
    assert [p.name for p in tmp_path.iterdir()] == ["mnt"]


def test_a_write_that_fails_with_enospc_is_one_line(tmp_path, corpus, capsys, monkeypatch):
    """The same without a tmpfs: safetensors' writer fails as on a full disk."""
    import attnlab.tensor_files as tensor_files

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tensor_files, "save_file", full)
    run = tmp_path / "run"
    argv = ["train", "classify", "--out", str(run), "--data", str(corpus), *TINY]
    err = probe(capsys, [*argv, "--max-steps", "2", "--eval-every", "2"], "No space left",
                after_training=True)  # fmt: skip
    assert "no checkpoint yet" in err
    monkeypatch.undo()
    assert main(["train", "classify", "--out", str(run), "--resume"]) == 0


# ---------------------------------------------------------------------------- read-only


@pytest.fixture(scope="module")
def finished(tmp_path_factory, corpus) -> Path:
    run = tmp_path_factory.mktemp("runs") / "done"
    assert train(run, corpus, "--max-steps", "4", "--eval-every", "2") == 0
    return run


@contextlib.contextmanager
def read_only(where: Path):
    """``where`` read-only: a read-only bind mount where possible, else chmod (non-root)."""
    bound = subprocess.run(["mount", "--bind", str(where), str(where)], capture_output=True)
    if bound.returncode == 0:
        remount = ["mount", "-o", "remount,bind,ro", str(where)]
        if subprocess.run(remount, capture_output=True).returncode == 0:
            try:
                yield "read-only file system"
            finally:
                subprocess.run(["umount", "-l", str(where)], check=False)
            return
        subprocess.run(["umount", "-l", str(where)], check=False)
    if os.geteuid() == 0:
        pytest.skip("root can write through chmod and this machine cannot mount read-only")
    modes = {p: p.stat().st_mode for p in [where, *where.rglob("*")]}
    for p in modes:
        p.chmod(modes[p] & ~0o222)
    try:
        yield "permission denied"
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def test_a_read_only_run_folder(tmp_path, finished, capsys) -> None:
    import shutil

    run = tmp_path / "ro"
    shutil.copytree(finished, run)
    before = snapshot(run)
    with read_only(run) as why:
        capsys.readouterr()
        assert main(["predict", str(run), "好"]) == 0  # reading works
        probe(capsys, ["explore", str(run), "好"], "explore.html", "--out")
        probe(capsys, ["train", "classify", "--out", str(run), "--resume", "--max-steps", "8"],
              why, "copy the run")  # fmt: skip
        probe(capsys, ["attention", str(run), "好"], "attention.png", "--out")
        probe(capsys, ["train", "classify", "--out", str(run / "sub"), *TINY], why)
        assert main(["explore", str(run), "好", "--out", str(tmp_path / "page.html")]) == 0
    assert snapshot(run) == before
