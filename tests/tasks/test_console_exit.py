"""The ``attnlab`` executable (``python -m attnlab``): `predict` ends without the interpreter's
teardown once its output is flushed; what it prints and the exit status are those of
``main``, through a pipe too, and a reader that goes away early leaves no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TEXTS = ["电影很好看", "剧情拖沓", "演员出色，推荐"]


def attnlab(*argv: str, stdout: int = subprocess.PIPE) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    env.pop("PYTHONUNBUFFERED", None)  # a pipe's output is then buffered, as a user's is
    return subprocess.run(
        [sys.executable, "-m", "attnlab", *argv], env=env, stdout=stdout,
        stderr=subprocess.PIPE, text=True, timeout=300,
    )  # fmt: skip


def test_predict_prints_every_line_through_a_pipe_and_keeps_the_exit_status(classify_run: Path):
    from attnlab.cli import main

    done = attnlab("predict", str(classify_run), *TEXTS)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if not line.startswith("  warning")]
    assert [line.split("\t")[-1] for line in lines] == TEXTS
    many = [f"{t}{i}" for i in range(300) for t in TEXTS]  # more than one 256-text batch
    done = attnlab("predict", str(classify_run), "--json", *many)
    assert done.returncode == 0 and len(done.stdout.splitlines()) == len(many)
    refused = attnlab("predict", str(classify_run), " ")
    assert refused.returncode == 2 and refused.stdout == ""
    [line] = refused.stderr.splitlines()
    assert line.startswith("attnlab: error: text 1 is empty")
    assert main(["predict", str(classify_run), " "]) == 2  # main's status is the process's


def test_predict_into_a_reader_that_stops_early_is_quiet(classify_run: Path):
    many = [f"{t}{i}" for i in range(2000) for t in TEXTS]
    head = subprocess.Popen(["head", "-n", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    done = attnlab("predict", str(classify_run), *many, stdout=head.stdin)  # type: ignore[arg-type]
    head.stdin.close()  # type: ignore[union-attr]
    first = head.stdout.read().decode()  # type: ignore[union-attr]
    head.wait()
    assert len(first.splitlines()) == 1
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
