"""Where ``precision="auto"`` keeps its step measurements, so a choice is made once per setting.

Timing the model's training step in fp32 and in the low precision decides ``auto`` on a device
whose capabilities leave the answer open, and a timing depends on what else the machine runs:
on a loaded machine two starts of one command could choose differently and train different
weights. So the first measurement is written to a small JSON file in attnlab's data cache
(``$ATTNLAB_DATA_DIR`` or ``~/.cache/attnlab``, ``precision.json``), one entry per setting:
the device (CPU model and its bf16 flags, or the GPU and its compute capability), the torch
version, the number of threads, the model (class, parameters, trainable parameters) and the
shapes of the micro-batch the step was timed on (a timing of one shape is not another's). A
later start with the same setting reads the choice instead of timing again; deleting the entry
(or the file) measures anew. A file that cannot be read or written is said in the reason and
the run goes on with its own measurement.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.data.english_sentiment import data_dir
from attnlab.train.precision import cpu_bf16_flag_names, cuda_name

RECORD_FILE = "precision.json"


def record_path() -> Path:
    """The measurements file: ``precision.json`` in attnlab's data cache."""
    return data_dir() / RECORD_FILE


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform knows."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def device_description(device: str | torch.device) -> str:
    """The device as a step measurement depends on it: the GPU and its compute capability, or
    the CPU's model and the bf16 flags it advertises."""
    if torch.device(device).type == "cuda":
        return f"cuda: {cuda_name(device)}"
    return f"cpu: {cpu_model()} ({' '.join(cpu_bf16_flag_names()) or 'no bf16 flags'})"


def batch_shapes(batch: Mapping[str, Any]) -> str:
    """The shapes of a collated batch's tensors, by name: ``hidden 16x48x384, labels 16``."""
    return ", ".join(
        f"{name} {'x'.join(str(n) for n in value.shape) or 'scalar'}"
        for name, value in sorted(batch.items())
        if isinstance(value, torch.Tensor)
    )


def setting_key(device: str, model: nn.Module, batch: Mapping[str, Any]) -> str:
    """One line naming what a step measurement depends on: the device (as ``device`` describes
    it), torch's version, the thread count, the model and the timed micro-batch's shapes."""
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return (
        f"{device}; torch {torch.__version__}; {torch.get_num_threads()} threads; "
        f"{type(model).__name__} {total} parameters ({trainable} trainable); "
        f"micro-batch {batch_shapes(batch)}"
    )


def load_records(path: Path) -> Any:
    """The file's JSON. Any damage (not UTF-8, not JSON, nested past the parser's depth) is
    raised as one of :data:`DAMAGE`."""
    return json.loads(path.read_text(encoding="utf-8"))


# What a damaged or unreadable record raises: it is read as no record, never as a crash.
DAMAGE = (OSError, ValueError, RecursionError, MemoryError)  # ValueError: bad UTF-8, bad JSON


def read_record(
    key: str, choices: tuple[str, ...], path: Path | None = None
) -> tuple[dict[str, Any] | None, str]:
    """(the entry recorded for ``key`` (precision, timing, date), or None where there is none,
    it is malformed, or its precision is not one of ``choices`` (what ``auto`` could pick on
    this device: a record edited to fp16 does not make a CPU train in fp16); a note when the
    file could not be read or the entry was not used)."""
    path = record_path() if path is None else path
    try:
        records = load_records(path)
    except FileNotFoundError:
        return None, ""
    except DAMAGE as err:
        return None, f"{path} is unreadable ({type(err).__name__}), so the step was timed again"
    entry = records.get(key) if isinstance(records, dict) else None
    usable = isinstance(entry, dict) and all(
        isinstance(entry.get(k), str) for k in ("precision", "timing", "date")
    )
    if not usable:
        return None, ""
    if entry["precision"] not in choices:
        return None, (
            f"{path} records {entry['precision']!r} for this setting, which auto cannot pick "
            f"here ({' or '.join(choices)}), so the step was timed again"
        )
    return entry, ""


def write_record(key: str, entry: dict[str, Any], path: Path | None = None) -> str:
    """Add ``entry`` under ``key`` (other entries kept, the file replaced atomically); return
    where it went, or why it could not be written."""
    path = record_path() if path is None else path
    try:
        records = load_records(path)
        if not isinstance(records, dict):
            records = {}
    except DAMAGE:  # a damaged file is replaced by this entry alone
        records = {}
    records[key] = entry
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(records, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return f"not recorded ({path}: {err.strerror or err}), so the next start times it again"
    return f"recorded in {path} for the next start with this setting"
