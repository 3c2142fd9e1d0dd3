"""``load_run(dir)``: any run directory, loaded as the run object of the task that made it."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attnlab.errors import UserError
from attnlab.models.skip_init import skipping_init
from attnlab.runs import datafiles, folder
from attnlab.runs.registry import get_task
from attnlab.runs.task import Run
from attnlab.runs.training import saved_arch, saved_config


def load_run(run_dir: str | Path, device: str = "cpu") -> Run:
    """The run in ``run_dir`` with the verbs that apply to it (``run.verbs``).

    A config.json of another layout is refused (folder.read_config); weights are checked on
    load (checksum, finite values)."""
    run_dir = Path(run_dir)
    raw = folder.read_config(run_dir)
    task = get_task(raw["task"])
    try:
        cfg = saved_config(task, raw)
    except ValueError as err:
        raise UserError(f"{run_dir / folder.CONFIG}: {err}") from None
    datafiles.relocate(cfg, run_dir)  # data files that moved, found again by their content
    weights = folder.WEIGHTS
    if not (run_dir / weights).is_file():
        raise UserError(
            f"{run_dir} has no {weights} yet: training has not finished its first evaluation; "
            f"continue it with `attnlab train {task.name} --out {run_dir} --resume`"
        )
    with skipping_init():  # every task's load fills its model from the run's weights, strictly
        run = task.load(run_dir, cfg, device)
    run.device = torch.device(device)
    return run


def recorded(run_dir: str | Path) -> tuple[str, str] | None:
    """(task, arch) that the run in ``run_dir`` records, arch "" for a task of one
    architecture; None when the folder holds no attnlab run (no config.json, or one that
    names no task: a Hugging Face checkpoint). A run's config.json of another layout, or of a
    task or architecture this attnlab does not have, is refused in one line."""
    path = Path(run_dir) / folder.CONFIG
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or "task" not in raw:
        return None
    raw = folder.read_config(run_dir)
    task = get_task(raw["task"])
    try:
        return task.name, saved_arch(task, raw)
    except ValueError as err:
        raise UserError(f"{path}: {err}") from None


def require_data(run: Run) -> None:
    """Refuse, with what to pass, when the data a run was trained on is gone or changed
    (commands that evaluate on the run's own splits need it)."""
    datafiles.require(
        run.config,
        run.run_dir,
        "restore it there, or evaluate on a labelled file with --data FILE",
        skip=get_task(run.task).train_only_paths,
    )


def load_run_of(run_dir: str | Path, kind: type, what: str, device: str = "cpu") -> Run:
    """``load_run`` that insists on one kind of run (``what`` names it in the error)."""
    run = load_run(run_dir, device)
    if not isinstance(run, kind):
        raise UserError(f"{run_dir} holds a {run.task!r} run, not {what}")
    return run
