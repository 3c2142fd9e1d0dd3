"""Tasks: the registry, the one runner, and one module per task (see docs/extending.md).

``attnlab.tasks.load_run(dir)`` loads any run folder; it is imported on first use, so importing
this package (as the command line does for its help) pulls in no torch."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "load_run":
        from attnlab.tasks.runs import load_run

        return load_run
    raise AttributeError(f"module 'attnlab.tasks' has no attribute {name!r}")
