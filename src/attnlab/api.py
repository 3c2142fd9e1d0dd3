"""The Python API: ``attnlab.load(RUN)`` and the verbs of the run it holds.

``attnlab.load("runs/classify").predict(["很好看"])`` gives what ``attnlab predict --json``
prints, number for number: the command line and ``attnlab serve`` call this same object. What it
adds to the run object (:func:`attnlab.runs.load_run`):

- **batches**: ``predict`` reads the texts in chunks of ``batch_size``, the texts sorted by
  length first so each chunk pads little, and answers in the order given;
- **threads**: every verb runs on ``threads`` intra-op threads (torch's setting is restored
  after the call). The default is one: on a machine whose cores other processes share, a forward
  pass that asks for more threads than are free waits at every operation for a descheduled
  thread: three sentences through the e5 classifier took a median 1.3 s on two threads against
  71 ms on one (docs/results/predict_warm.md). ``threads=0`` keeps torch's own setting (one per
  core), for a machine whose cores are the run's alone (not measured here: this one's are
  shared);
- **one refusal** for a verb the run lacks, naming the verbs it has.

The run object itself stays reachable as ``.run`` (its model, tokenizer, labels).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.data.io import is_blank
from attnlab.errors import UserError
from attnlab.runs.load import load_run
from attnlab.runs.task import Run

# The verbs a run object may have (Run.verbs lists those of one run).
VERBS = ("predict", "evaluate", "attention", "generate", "translate", "embed")
BATCH_SIZE = 64  # texts per forward pass of predict


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block on ``threads`` intra-op threads (0: torch's setting), then restore it."""
    if not threads:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_texts(texts: Any) -> list[str]:
    """``texts`` as a list of non-blank strings, or a one-line UserError naming the first
    that is not, counted from 1. A lone string is refused: iterating it would classify its
    characters one by one."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise UserError(f"texts must be a list of strings, got {type(texts).__name__}")
    if not texts:
        raise UserError("no texts given; pass a list of at least one")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise UserError(f"text {i + 1} is a {type(text).__name__}, not a string")
        if is_blank(text):
            raise UserError(f"text {i + 1} is empty; give some words to read")
    return list(texts)


def check_settings(threads: int, batch_size: int) -> None:
    if threads < 0:
        raise UserError(f"threads must be >= 0 (0 = torch's setting), got {threads}")
    if batch_size < 1:
        raise UserError(f"batch_size must be >= 1, got {batch_size}")


class LoadedRun:
    """A trained run ready for use: its verbs as methods, batched, on a fixed thread count."""

    def __init__(self, run: Run, threads: int = 1, batch_size: int = BATCH_SIZE) -> None:
        check_settings(threads, batch_size)
        self.run, self.threads, self.batch_size = run, threads, batch_size

    @classmethod
    def open(
        cls, run_dir: str | Path, device: str = "cpu", threads: int = 1,
        batch_size: int = BATCH_SIZE,
    ) -> LoadedRun:  # fmt: skip
        """Load the run in ``run_dir`` (any task; its weights checked) onto ``device``."""
        check_settings(threads, batch_size)
        with torch_threads(threads):
            return cls(load_run(run_dir, device), threads, batch_size)

    @property
    def verbs(self) -> tuple[str, ...]:
        return self.run.verbs

    @property
    def labels(self) -> list[str]:
        """A classifier's classes, in the order of its outputs."""
        self.run.require("predict")
        labels = getattr(self.run, "labels", None)
        return list(labels.labels) if labels is not None else list(self.run.classes)

    def __repr__(self) -> str:
        return f"LoadedRun({str(self.run.run_dir)!r}, task={self.run.task!r}, verbs={self.verbs})"

    def predict(self, texts: Sequence[str], batch_size: int | None = None) -> list[dict[str, Any]]:
        """One dict per text, in order: ``label``, ``probs`` (class -> probability) and what
        the run adds (``unknown_share``, ``truncated``, ...). Image runs take file paths."""
        self.run.require("predict")
        texts = check_texts(texts)
        size = batch_size or self.batch_size
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # little padding a chunk
        out: list[dict[str, Any]] = [{} for _ in texts]
        with torch_threads(self.threads), torch.no_grad():
            for start in range(0, len(order), size):
                rows = order[start : start + size]
                for i, pred in zip(rows, self.run.predict([texts[i] for i in rows])):  # type: ignore[attr-defined]
                    out[i] = pred
        return out

    def __getattr__(self, name: str) -> Any:
        """The run's other verbs (evaluate, attention, generate, translate, embed), each run on
        the loaded thread count; a verb this run lacks is refused with those it has."""
        if name not in VERBS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self.run.require(name)
        verb = getattr(self.run, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            with torch_threads(self.threads), torch.no_grad():
                return verb(*args, **kwargs)

        call.__doc__ = verb.__doc__
        return call
