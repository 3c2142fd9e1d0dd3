"""Helpers for tests that run `_tiny_task.py` in subprocesses (plain python or torchrun)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from attnlab.train.metrics_log import read_metrics

SCRIPT = Path(__file__).with_name("_tiny_task.py")
ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def launch(
    run_dir: Path, args: list[str], nproc: int = 1, node: tuple[int, int, str] | None = None
) -> subprocess.Popen:
    """Start the tiny task on `run_dir` (under torchrun when nproc > 1); ``node`` = (node rank,
    number of nodes, rendezvous endpoint) starts one node of a multi-node job instead."""
    runner = [sys.executable]
    if node is not None:
        rank, nnodes, endpoint = node
        runner += ["-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node-rank={rank}",
                   f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                   f"--rdzv-endpoint={endpoint}", "--rdzv-id=attnlab-test"]  # fmt: skip
    elif nproc > 1:
        runner += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return subprocess.Popen(
        [*runner, str(SCRIPT), str(run_dir), *args],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # its own process group, see finish()


def finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    """Wait for a successful exit and return the output; on timeout kill the whole process
    group (torchrun's workers too) and fail with what it printed."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s:\n{out}") from None
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out}"
    return out


def checkpoint_step(run_dir: Path) -> int:
    """Step of the checkpoint in run_dir/state (-1 if none is readable right now)."""
    try:
        return json.loads((run_dir / "state" / "trainer.json").read_text())["loop"]["step"]
    except (OSError, ValueError, KeyError):
        return -1


def wait_for_checkpoint(
    run_dir: Path, proc: subprocess.Popen, after_step: int, timeout: float = 120
) -> int:
    """Poll until a checkpoint newer than `after_step` exists; fail if the process ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        step = checkpoint_step(run_dir)
        if step > after_step:
            return step
        if proc.poll() is not None:
            raise AssertionError(f"process ended before a checkpoint:\n{proc.communicate()[0]}")
        time.sleep(0.01)
    raise AssertionError("timed out waiting for a checkpoint")


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def curves(run_dir: Path, drop: frozenset = frozenset({"elapsed_s", "tokens_per_s"})) -> list:
    """metrics.jsonl without the wall-clock fields."""
    return [
        {k: v for k, v in r.items() if k not in drop}
        for r in read_metrics(run_dir / "metrics.jsonl")
    ]
