"""Where metric events go: `run_dir/metrics.jsonl` (one JSON object per line) and TensorBoard."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

_NOT_SCALARS = {"step", "epoch", "split", "precision"}


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Parse metrics.jsonl, skipping a torn last line left by a killed process (and any line
    that is not a JSON object)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def truncate_metrics(path: str | Path, max_step: int) -> int:
    """Keep only records with step <= `max_step` (used on resume); return how many remain."""
    path = Path(path)
    if not path.exists():
        return 0
    kept = [r for r in read_metrics(path) if r.get("step", 0) <= max_step]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return len(kept)


class MetricsLog:
    """Appends events to metrics.jsonl and mirrors numeric fields to TensorBoard (rank 0 only)."""

    def __init__(self, run_dir: Path, tensorboard: bool, purge_step: int | None = None) -> None:
        """Open run_dir/metrics.jsonl for appending; TensorBoard events from `purge_step` on are
        dropped (so a resumed run does not duplicate steps)."""
        self.path = run_dir / "metrics.jsonl"
        self._file = open(self.path, "a")  # noqa: SIM115 - closed in close()
        self._writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                print(
                    "[attnlab] tensorboard is not installed; skipping TensorBoard logs",
                    file=sys.stderr,
                )
            else:
                self._writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        """Append one event (must hold "step" and "split") and flush it."""
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._writer is not None:
            for key, value in record.items():
                if key not in _NOT_SCALARS and isinstance(value, int | float):
                    self._writer.add_scalar(f"{record['split']}/{key}", value, record["step"])

    def close(self) -> None:
        """Flush and close the file and the TensorBoard writer."""
        self._file.close()
        if self._writer is not None:
            self._writer.close()
