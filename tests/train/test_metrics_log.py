"""metrics.jsonl handling (torn lines, truncation on resume) and the curves plot."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from attnlab.train.metrics_log import MetricsLog, read_metrics, truncate_metrics


def write_log(path: Path, records: list[dict], torn: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + torn)


def test_torn_last_line_is_skipped_and_truncation_keeps_early_steps(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    records = [{"step": s, "split": "train", "loss": 1.0 / s} for s in range(1, 6)]
    write_log(path, records, torn='{"step": 6, "spl')  # a process killed mid-write
    assert read_metrics(path) == records
    assert truncate_metrics(path, max_step=3) == 3
    assert read_metrics(path) == records[:3]
    assert path.read_text().endswith("\n")


def test_metrics_log_appends_and_flushes(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, tensorboard=False)
    log.write({"step": 1, "split": "train", "loss": 2.0})
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "split": "train", "loss": 2.0}]
    log.close()


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_plot_curves_has_one_panel_per_val_metric(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from attnlab.train.curves import plot_curves

    path = tmp_path / "metrics.jsonl"
    train = [{"step": s, "split": "train", "loss": 3.0 / s, "acc": s / 10} for s in range(1, 9)]
    val = [
        {
            "step": s,
            "split": "val",
            "val_loss": 2.0 / s,
            "val_acc": s / 9,
            "val_bleu": s,
            "best": True,
            "precision": "fp32",
        }
        for s in (4, 8)
    ]
    write_log(path, train + val)
    width, _ = png_size(plot_curves(path, tmp_path / "a.png"))
    write_log(path, train)
    width_train_only, _ = png_size(plot_curves(path, tmp_path / "b.png"))
    assert width == 3 * width_train_only  # loss + val_acc + val_bleu panels vs loss alone
    write_log(path, [])
    with pytest.raises(ValueError, match="no train or val records"):
        plot_curves(path, tmp_path / "c.png")
