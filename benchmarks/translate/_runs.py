"""What the translation benchmarks read back from a finished run directory."""

from __future__ import annotations

from pathlib import Path

from attnlab.tasks import rundir
from attnlab.tasks.registry import get_task
from attnlab.tasks.runner import saved_config
from attnlab.tasks.task import RunConfig


def read_run_config(run: Path) -> RunConfig:
    """The saved config of a run directory, without loading its weights."""
    raw = rundir.read_config(run)
    return saved_config(get_task(raw["task"]), raw)
