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
import inspect
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.data.io import clean_text, is_blank
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
    characters one by one. A lone surrogate (``"\\ud800"``, which no tokenizer encodes)
    becomes U+FFFD, as the command line and the server read it."""
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise UserError(f"texts must be a list of strings, got {type(texts).__name__}")
    if not texts:
        raise UserError("no texts given; pass a list of at least one")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise UserError(f"text {i + 1} is a {type(text).__name__}, not a string")
        if is_blank(text):
            raise UserError(f"text {i + 1} is empty; give some words to read")
    return [clean_text(text) for text in texts]


def check_text(text: Any, name: str = "text") -> str:
    """One non-blank string (a lone surrogate made U+FFFD), or a one-line UserError."""
    if not isinstance(text, str):
        raise UserError(f"{name} must be a string, got {type(text).__name__}")
    if is_blank(text):
        raise UserError(f"{name} is empty; give some words to read")
    return clean_text(text)


def check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """``value`` if it is a whole number (not a bool) in [minimum, maximum], else one line."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{name} must be a whole number, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise UserError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise UserError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_settings(threads: Any, batch_size: Any) -> None:
    """Threads between 0 (torch's setting) and the machine's cores (more would each wait for a
    core, and a huge count exhausts memory starting them), a batch size of at least one."""
    check_int("threads", threads, -1)
    if threads < 0:
        raise UserError(f"threads must be >= 0 (0 = torch's setting), got {threads}")
    cores = os.cpu_count() or 1
    if threads > cores:
        raise UserError(f"threads={threads}, but this machine has {cores} cores; give at most that")
    check_int("batch_size", batch_size, 1)


def check_device(device: Any, option: str = "device") -> torch.device:
    """``device`` as a torch device this torch can run attnlab on, or one line naming the fix.
    ``option``: how the caller names it (``--device`` on the command line)."""

    def said(value: Any, quoted: bool = False) -> str:
        if option.startswith("-"):  # a command-line flag
            return f"{option} {value!r}" if quoted else f"{option} {value}"
        return f"{option}={value!r}"

    cpu = said("cpu")
    if not isinstance(device, (str, torch.device)):
        raise UserError(f"{option} must be a string such as 'cpu' or 'cuda', got {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UserError(f"{said(device, True)} is not a device; use cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{said(device)}, but torch sees no CUDA device; use {cpu}")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UserError(
            f"{said(device)}: torch sees {torch.cuda.device_count()} CUDA device(s), numbered "
            f"from 0; use {said('cuda:0')}"
        )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"{said(device)}, but torch sees no MPS device; use {cpu}")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"{said(device)}: attnlab runs on cpu, cuda or mps")
    return dev


def check_path(name: str, value: Any) -> None:
    """One line when the file argument ``name`` is not a path (str or Path)."""
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise UserError(f"{name} must be a file path, got {type(value).__name__} {value!r}")


def check_run_dir(run_dir: Any) -> Path:
    """A run folder's path, or one line when ``run_dir`` is no path at all."""
    if not isinstance(run_dir, (str, os.PathLike)) or isinstance(run_dir, bytes):
        raise UserError(
            f"the run must be a folder path (str or Path), got {type(run_dir).__name__}"
        )
    if not str(run_dir):
        raise UserError("the run's folder is an empty string; give the folder of a trained run")
    return Path(run_dir)


class LoadedRun:
    """A trained run ready for use: its verbs as methods, batched, on a fixed thread count."""

    def __init__(self, run: Run, threads: int = 1, batch_size: int = BATCH_SIZE) -> None:
        check_settings(threads, batch_size)
        self.run, self.threads, self.batch_size = run, threads, batch_size
        self.inference_path: Any = None  # the Choice take_path made (attnlab.infer.precision)

    @classmethod
    def open(
        cls, run_dir: str | Path, device: str = "cpu", threads: int | str = 1,
        batch_size: int = BATCH_SIZE, precision: str = "fp32", compile: bool = False,
    ) -> LoadedRun:  # fmt: skip
        """Load the run in ``run_dir`` (any task; its weights checked) onto ``device``.

        ``precision``: the path a text classifier's predict takes, fp32, int8, bf16 or auto
        (the fastest whose labels equal fp32's on a check set, measured here);
        ``threads="auto"``: 1 or every usable core, whichever the measurement finds faster;
        ``compile``: that path through ``torch.compile``, compiled here. ``.inference_path``
        says which was taken and why (attnlab.infer.precision)."""
        auto = threads == "auto"
        threads = 1 if auto else threads
        check_settings(threads, batch_size)
        run_dir = check_run_dir(run_dir)
        check_device(device)
        with torch_threads(threads):  # type: ignore[arg-type]
            loaded = cls(load_run(run_dir, device), threads, batch_size)  # type: ignore[arg-type]
        loaded.take_path(precision, auto, compile)
        return loaded

    def take_path(self, precision: str, auto_threads: bool = False, compile: bool = False) -> None:
        """Set the path predict takes (see :meth:`open`), measured on 1 and every usable core
        when ``auto_threads``, and compiled when ``compile``."""
        from attnlab.infer.precision import Choice, usable_cores

        counts = sorted({1, usable_cores()}) if auto_threads else [self.threads or 1]
        use = getattr(self.run, "use_precision", None)
        if use is None:  # image runs, language models: one path
            if precision not in ("fp32", "auto"):
                raise UserError(f"precision {precision!r}: {self.run.run_dir} has only fp32")
            if compile:
                raise UserError(f"compile: only a text classifier's predict is compiled; "
                                f"{self.run.run_dir} is a {self.run.task} run: "
                                "drop it")  # fmt: skip
            self.inference_path = Choice("fp32", self.threads, f"fp32 ({self.run.task} run)")
            return
        with torch.no_grad():
            self.inference_path = use(precision, counts, compile)
        if auto_threads:
            self.threads = self.inference_path.threads

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
        size = self.batch_size if batch_size is None else check_int("batch_size", batch_size, 1)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # little padding a chunk
        out: list[dict[str, Any]] = [{} for _ in texts]
        with torch_threads(self.threads), torch.no_grad():
            for start in range(0, len(order), size):
                rows = order[start : start + size]
                for i, pred in zip(rows, self.run.predict([texts[i] for i in rows])):  # type: ignore[attr-defined]
                    out[i] = pred
        return out

    def score_file(
        self, data: str | Path, out: str | Path, text_col: str = "text", resume: bool = False,
        progress: bool = True,
    ) -> dict[str, Any]:  # fmt: skip
        """Score every row of a CSV, TSV or JSONL file into ``out`` (same formats, from the
        extension): the input's columns, ``predicted_label`` and ``prob_<class>`` per class.
        ``resume`` continues an ``out`` a killed call left, scoring no row twice
        (attnlab.infer.score_file). Returns {rows, scored, resumed, seconds, texts_per_s, out,
        longer_than_training}."""
        from attnlab.infer.score_file import score_file

        self.run.require("predict")
        for name, value in (("data", data), ("out", out)):
            check_path(name, value)
        if not isinstance(text_col, str):
            raise UserError(f"text_col must be a column name, got {type(text_col).__name__}")
        if not hasattr(self.run, "tokenizer"):
            raise UserError(f"{self.run.run_dir} classifies images; score_file reads texts")
        return score_file(self.predict, self.labels, data, out, text_col, resume, progress)

    def __getattr__(self, name: str) -> Any:
        """The run's other verbs (evaluate, attention, generate, translate, embed), each run on
        the loaded thread count; a verb this run lacks is refused with those it has."""
        if name not in VERBS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self.run.require(name)
        verb = getattr(self.run, name, None)
        if verb is None:  # a verb the command line has but this run's object only draws
            raise UserError(
                f"{self.run.run_dir} holds a {self.run.task!r} run, whose {name} the Python API "
                f"does not return; `attnlab {name} {self.run.run_dir} INPUT` draws it"
            )

        def call(*args: Any, **kwargs: Any) -> Any:
            bound = check_arguments(self.run, name, verb, args, kwargs)
            with torch_threads(self.threads), torch.no_grad():
                return verb(*bound.args, **bound.kwargs)

        call.__doc__ = verb.__doc__
        return call


SPLITS = ("train", "val", "test")  # the splits every run keeps (`attnlab eval --split`)
INT_SETTINGS = {"top_k": 0, "seed": 0, "num_samples": 1, "lookahead": 1}  # generate's, minimum
REAL_SETTINGS = ("temperature", "top_p")


def check_arguments(
    run: Run, verb_name: str, verb: Any, args: tuple, kwargs: dict[str, Any]
) -> inspect.BoundArguments:
    """The call ``verb(*args, **kwargs)`` with each argument checked (texts, splits, paths,
    counts), or one line naming the first that is wrong: what reaches the run is what it can
    read."""
    try:
        bound = inspect.signature(verb).bind(*args, **kwargs)
    except TypeError as err:
        raise UserError(f"{verb_name}{inspect.signature(verb)}: {err}") from None
    given = bound.arguments
    for name, value in list(given.items()):
        if name == "texts":
            given[name] = check_texts(value)
        elif name in ("text", "image"):
            given[name] = check_text(value, name)
        elif name == "prompt" and value is not None:
            if not isinstance(value, str):
                raise UserError(f"prompt must be a string, got {type(value).__name__}")
            given[name] = clean_text(value)
        elif name == "split" and value not in SPLITS:
            raise UserError(
                f"split={value!r}: this run has the splits {', '.join(SPLITS)}; give one of "
                "them, or data=FILE"
            )
        elif name == "data" and value is not None:
            check_path(name, value)
        elif name in ("text_col", "label_col") and not isinstance(value, (str, type(None))):
            raise UserError(f"{name} must be a column name, got {type(value).__name__}")
        elif name == "beam_size" and value is not None:
            check_int("beam_size", value, 1)
        elif name == "member":
            check_int("member", value, 0, getattr(run, "members", 1) - 1)
        elif name == "max_new_tokens":
            check_int("max_new_tokens", value, 1)
        elif name == "settings":
            check_generate_settings(value)
    if verb_name == "evaluate" and given.get("data") is None:
        from attnlab.runs.load import require_data

        require_data(run)  # the run's own split needs the data it was trained on
    return bound


def check_generate_settings(settings: dict[str, Any]) -> None:
    """``generate``'s keyword settings: counts whole numbers, rates real numbers, stops strings."""
    for name, minimum in INT_SETTINGS.items():
        if name in settings:
            check_int(name, settings[name], minimum)
    for name in REAL_SETTINGS:
        value = settings.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    stops = settings.get("stops", [])
    if isinstance(stops, str) or not all(isinstance(stop, str) for stop in stops):
        raise UserError("stops must be a list of strings")
