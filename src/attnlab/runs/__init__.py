"""Runs: what a task is (``task``), the task registry, config sections, the run folder
(``folder``: lock, staging, config.json), the one training runner (``training``), the data files
a run was trained from, and loading any run folder (``load``). The tasks themselves live in
:mod:`attnlab.tasks`; docs/extending.md walks through adding one.

``attnlab.runs.load_run(dir)`` loads any run folder; it is imported on first use, so importing
this package (as the command line does for its help) pulls in no torch."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "load_run":
        from attnlab.runs.load import load_run

        return load_run
    raise AttributeError(f"module 'attnlab.runs' has no attribute {name!r}")
