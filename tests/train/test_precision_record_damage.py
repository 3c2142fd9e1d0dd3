"""A damaged precision.json is read as no record: the run times its step and trains (a file
nested past the JSON parser's depth once crashed every start after its frozen passes), and a
recorded choice auto could not make on this device (fp16 on a CPU) is not obeyed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab.train import precision as prec
from attnlab.train import precision_record

NESTED = "[" * 100_000 + "]" * 100_000  # valid JSON nested past the parser's recursion limit


def fit_auto(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, list]:
    """A fresh start of the tiny task under precision auto on a CPU with native bf16, its step
    timed (injected) as bf16 twice as fast; returns (summary, timings asked)."""
    from _tiny_task import TinyData, TinyTagger, step_fn

    from attnlab.train import TrainConfig, Trainer
    from attnlab.train import engine as eng

    monkeypatch.setattr(prec, "cpu_bf16_flags", lambda: True)
    asked: list[tuple[str, ...]] = []

    def timed(run_step, names, **kwargs) -> dict[str, float]:
        asked.append(tuple(names))
        return {"fp32": 1.0, "bf16": 0.5}

    monkeypatch.setattr(eng, "time_step_precisions", timed)
    torch.manual_seed(0)
    cfg = TrainConfig(max_steps=1, batch_size=8, precision="auto", tensorboard=False)
    return Trainer(TinyTagger(), cfg, run_dir, TinyData(), step_fn).fit(), asked


def test_a_record_nested_past_the_parsers_depth_is_read_as_none_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision_record_file: Path
) -> None:
    precision_record_file.write_text(NESTED)
    summary, asked = fit_auto(tmp_path / "run", monkeypatch)
    assert asked == [("fp32", "bf16")] and summary["steps"] == 1
    assert summary["precision"] == "bf16" and "is unreadable" in summary["precision_reason"]
    (entry,) = json.loads(precision_record_file.read_text()).values()  # rewritten whole
    assert entry["precision"] == "bf16"


def test_a_recorded_choice_auto_cannot_make_here_is_timed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision_record_file: Path
) -> None:
    fit_auto(tmp_path / "first", monkeypatch)
    records = json.loads(precision_record_file.read_text())
    for edited in ("fp16", "int8"):
        precision_record_file.write_text(
            json.dumps({k: {**v, "precision": edited} for k, v in records.items()})
        )
        summary, asked = fit_auto(tmp_path / edited, monkeypatch)
        assert asked == [("fp32", "bf16")], "the edited entry must not be obeyed"
        assert summary["precision"] == "bf16"
        assert (
            f"records {edited!r} for this setting, which auto cannot pick here (fp32 or bf16)"
            in (summary["precision_reason"])
        )


def test_read_record_keeps_only_what_auto_could_pick(tmp_path: Path) -> None:
    path = tmp_path / "precision.json"
    entry = {"precision": "fp16", "timing": "fp32 2.0 ms, fp16 1.0 ms: 2.00x", "date": "today"}
    path.write_text(json.dumps({"k": entry}))
    assert precision_record.read_record("k", ("fp32", "fp16"), path) == (entry, "")
    got, note = precision_record.read_record("k", ("fp32", "bf16"), path)
    assert got is None and "auto cannot pick here" in note
    assert precision_record.read_record("other", ("fp32", "bf16"), path) == (None, "")
