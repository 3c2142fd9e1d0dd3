"""The worked example of docs/extending.md is real: its code, registered with one line, trains
through the CLI, loads with load_run and predicts."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.runs import load_run, registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def example_code() -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## A worked example", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_task_trains_loads_and_predicts(tmp_path, monkeypatch, capsys) -> None:
    code = example_code()
    assert len(code.splitlines()) < 150
    (tmp_path / "sorted_task.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = registry.TaskEntry("sorted", "are these digits in order?", "sorted_task")
    monkeypatch.setitem(registry.REGISTRY, "sorted", entry)
    run = tmp_path / "run"
    args = ["--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--d-ff", "64"]
    args += ["--ngram-buckets", "0", "--max-steps", "300", "--eval-every", "100", "--lr", "3e-3"]
    args += ["--batch-size", "32", "--tensorboard", "false", "--precision", "fp32"]
    assert main(["train", "sorted", "--out", str(run), *args, "--num-threads", "1"]) == 0
    assert "validation accuracy" in capsys.readouterr().out
    loaded = load_run(run)
    preds = loaded.predict(["013579", "975310"])
    assert [p["label"] for p in preds] == ["sorted", "unsorted"]
    with pytest.raises(ValueError, match="cannot generate"):
        loaded.require("generate")
    assert json.loads((run / "results.json").read_text())["val_acc"] >= 0.85
    sys.modules.pop("sorted_task", None)
