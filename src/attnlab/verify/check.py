"""The machinery of ``attnlab verify``: a check, what it measured, and the table of results.

A :class:`Check` names a component and its oracle, the modules the oracle needs, a tolerance on
the largest absolute difference, and a function that fills a :class:`Measure` (every tensor
compared, every case counted, any non-numeric disagreement such as a different greedy token
recorded as a failure). :func:`run_checks` seeds torch before each check, so one seed replays
any row, and turns each into a :class:`Row`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

PASS, FAIL, MISSING, ERROR = "pass", "FAIL", "missing", "ERROR"


class Measure:
    """Largest absolute difference over everything compared, cases run, failures noted."""

    def __init__(self) -> None:
        self.cases = 0
        self.error = 0.0
        self.failures: list[str] = []

    def case(self) -> None:
        self.cases += 1

    def diff(self, got: Tensor, want: Tensor, what: str = "output") -> None:
        """Compare two tensors of the same shape (detached); NaN counts as an infinite error."""
        if got.shape != want.shape:
            self.failures.append(f"{what}: shape {tuple(got.shape)} vs {tuple(want.shape)}")
            return
        if got.numel() == 0:
            return
        err = (got.detach().double() - want.detach().double()).abs().max().item()
        self.error = max(self.error, err if math.isfinite(err) else math.inf)

    def value(self, err: float) -> None:
        """An error computed elsewhere (e.g. over all linked gradients)."""
        self.error = max(self.error, err if math.isfinite(err) else math.inf)

    def fail(self, message: str) -> None:
        self.failures.append(message)


@dataclass(frozen=True)
class Oracle:
    """An importable module (optionally one of its attributes) a check needs, and how to
    install it."""

    module: str
    install: str
    attr: str = ""

    def available(self) -> bool:
        if importlib.util.find_spec(self.module) is None:
            return False
        return not self.attr or hasattr(importlib.import_module(self.module), self.attr)

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attr}" if self.attr else self.module


@dataclass(frozen=True)
class Check:
    component: str
    oracle: str
    tolerance: float
    run: Callable[[Measure], None]
    needs: tuple[Oracle, ...] = ()


@dataclass
class Row:
    component: str
    oracle: str
    cases: int
    max_abs_error: float | None
    tolerance: float
    status: str
    note: str = ""
    seconds: float = 0.0
    seed: int = 0
    missing: list[str] = field(default_factory=list)


def missing_oracles(check: Check) -> list[Oracle]:
    return [o for o in check.needs if not o.available()]


def run_check(check: Check, seed: int) -> Row:
    """Run one check from ``torch.manual_seed(seed)``; never raises (errors become rows)."""
    row = Row(check.component, check.oracle, 0, None, check.tolerance, PASS, seed=seed)
    lacking = missing_oracles(check)
    if lacking:
        row.status = MISSING
        row.missing = [o.name for o in lacking]
        row.note = "; ".join(f"{o.name} missing: {o.install}" for o in lacking)
        return row
    torch.manual_seed(seed)
    measure = Measure()
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():  # the oracles' deprecation chatter is not a result
            warnings.simplefilter("ignore")
            check.run(measure)
    except Exception as exc:  # a crash in a check is reported in its row, the rest still run
        row.status = ERROR
        row.note = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    row.seconds = time.perf_counter() - start
    row.cases = measure.cases
    row.max_abs_error = measure.error
    if row.status == ERROR:
        return row
    if measure.failures:
        row.status = FAIL
        row.note = "; ".join(measure.failures)[:200]
    elif not measure.error <= check.tolerance:  # NaN compares False: a failure
        row.status = FAIL
    elif measure.cases == 0:
        row.status = FAIL
        row.note = "no case ran"
    return row


def run_checks(checks: Sequence[Check], seed: int, progress: Callable[[Row], None] | None = None):
    """Every check in order, each from the same seed; -> list of Rows."""
    rows = []
    for check in checks:
        row = run_check(check, seed)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def failed(rows: Sequence[Row]) -> bool:
    return any(r.status in (FAIL, ERROR) for r in rows)


def format_table(rows: Sequence[Row]) -> str:
    """A fixed-width text table: component, oracle, cases, max abs error, tolerance, pass."""
    header = ("component", "oracle", "cases", "max abs error", "tolerance", "pass", "s")
    lines = [
        (
            r.component,
            r.oracle,
            str(r.cases) if r.status != MISSING else "-",
            "-" if r.max_abs_error is None else f"{r.max_abs_error:.2e}",
            f"{r.tolerance:.0e}",
            r.status,
            f"{r.seconds:.1f}",
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    out.append("  ".join("-" * w for w in widths))
    for r, line in zip(rows, lines):
        text = "  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip()
        out.append(text + (f"  ({r.note})" if r.note else ""))
    return "\n".join(out)


def write_json(rows: Sequence[Row], path: str | Path, meta: dict) -> None:
    """The table as JSON: {"meta": {...}, "rows": [...]}; infinities written as null."""

    def clean(row: Row) -> dict:
        d = asdict(row)
        err = d["max_abs_error"]
        d["max_abs_error"] = err if err is None or math.isfinite(err) else None
        d["passed"] = row.status == PASS
        return d

    Path(path).write_text(json.dumps({"meta": meta, "rows": [clean(r) for r in rows]}, indent=2))
