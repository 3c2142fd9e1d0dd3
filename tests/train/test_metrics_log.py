"""metrics.jsonl handling (torn lines, truncation on resume), the curves plot and its MoE
expert-usage panels."""

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


def test_expert_usage_reads_what_the_lm_step_logs() -> None:
    import torch

    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.tasks.lm import lm_step
    from attnlab.train.curves import expert_usage

    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=11, context=8, n_layers=3, n_heads=2, d_model=8, ffn="moe", experts=11,
        top_k=2, capacity_factor=0.5,
    )  # fmt: skip
    model = GPT(cfg)
    batch = {"input_ids": torch.randint(0, 11, (2, 8)), "targets": torch.randint(0, 11, (2, 8))}
    logged = [
        {"step": s, "split": "train", "loss": 1.0, **lm_step(model, batch).metrics}
        for s in (10, 20)
    ]
    val = {"step": 20, "split": "val", "val_loss": 1.0, "moe0_e0": 9.0}  # not a train record
    usage = expert_usage([*logged, val])
    assert list(usage) == [0, 1, 2]
    names = [f"e{j}" for j in range(11)] + ["dropped"]  # numeric order: e10 after e9
    expected = {
        i: {n: [(r["step"], r[f"moe{i}_{n}"]) for r in logged] for n in names} for i in range(3)
    }
    assert usage == expected and all(list(usage[i]) == names for i in usage)  # dicts: + order
    assert all(pts[0][1] > 0 for pts in (usage[i]["dropped"] for i in usage))  # capacity 0.5
    assert expert_usage([{"step": 1, "split": "train", "loss": 2.0, "aux_loss": 0.1}]) == {}


def test_plot_curves_adds_a_row_of_expert_usage_panels(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from attnlab.train.curves import plot_curves

    path = tmp_path / "metrics.jsonl"
    train = [{"step": s, "split": "train", "loss": 3.0 / s} for s in range(1, 9)]
    val = [{"step": 8, "split": "val", "val_loss": 1.0}]
    write_log(path, train + val)
    width, height = png_size(plot_curves(path, tmp_path / "dense.png"))
    usage = {f"moe{i}_e{j}": (j + 1) / 10 for i in (1, 3, 5) for j in range(4)}
    write_log(path, [{**r, **usage, "moe1_dropped": 0.0} for r in train] + val)
    assert png_size(plot_curves(path, tmp_path / "moe.png")) == (3 * width, 2 * height)
