"""What the translation benchmarks read back from a finished run directory."""

from __future__ import annotations

from pathlib import Path

from attnlab.runs import folder
from attnlab.runs.registry import get_task
from attnlab.runs.task import RunConfig
from attnlab.runs.training import saved_config


def read_run_config(run: Path) -> RunConfig:
    """The saved config of a run directory, without loading its weights."""
    raw = folder.read_config(run)
    return saved_config(get_task(raw["task"]), raw)
