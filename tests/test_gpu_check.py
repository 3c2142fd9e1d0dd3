"""scripts/gpu_check.sh: its dry run (every stage on the CPU at toy sizes) ends with every
stage ok and every result file written; the bookkeeping classifies stage outcomes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
DRY_STAGES = [
    "install",
    "env",
    "tests",
    "bench_kernels",
    "bench_mha",
    "classify",
    "lm",
    "flash_triton",
]


def _report_module():
    spec = importlib.util.spec_from_file_location(
        "gpu_check_report", SCRIPT.with_name("gpu_check_report.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_dry_run_runs_every_stage_and_writes_every_result(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check"
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", str(out)], capture_output=True, text=True, timeout=2100
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert (out / "stages.txt").read_text().split() == DRY_STAGES
    for name in DRY_STAGES:
        result = json.loads((out / "results" / f"{name}.json").read_text())
        assert result["status"] == "ok", (name, result["log_tail"])
        assert result["exit_code"] == 0 and 0 < result["seconds"] <= result["limit_s"] + 10
        assert all(result["outputs"].values()), (name, result["outputs"])
        assert (out / "logs" / f"{name}.log").stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["all_ok"] and [s["stage"] for s in summary["stages"]] == DRY_STAGES
    assert summary["total_s"] <= summary["budget_s"]
    md = (out / "summary.md").read_text()
    assert all(f"| {name} | ok | 0 |" in md for name in DRY_STAGES), md
    env = json.loads((out / "env.json").read_text())
    assert env["requested_device"] == "cpu" and "torch" in env
    tests = json.loads((out / "results" / "tests.json").read_text())["details"]
    assert tests["tests"] > 0 and tests["failures"] == 0 and tests["errors"] == 0
    for section in ("kernels", "mha"):
        bench = json.loads((out / "bench" / f"{section}.json").read_text())
        assert section in bench["sections"] and bench["machine"]["device"] == "cpu"
    for run in ("classify", "lm"):
        assert json.loads((out / "runs" / run / "results.json").read_text())
    flash = json.loads((out / "bench" / "flash_triton.json").read_text())
    assert flash["settings"]["quick"] and set(flash["points"]) == {"sdpa", "triton", "torch_flash"}
    for row in flash["points"]["torch_flash"] + flash["points"]["triton"]:
        assert "max_abs_err" in row or row.get("skipped") == "triton is not installed", row
        assert row.get("max_abs_err", 0) < 1e-5, row
    junit = (out / "tests" / "flash_triton.xml").read_text()
    assert 'failures="0"' in junit and 'errors="0"' in junit, junit[:500]


def test_stage_outcomes_are_classified(tmp_path: Path) -> None:
    report = _report_module()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.log").write_text("\n".join(f"line {i}" for i in range(40)))
    (tmp_path / "made.json").write_text("{}")
    cases = [
        (0, "made.json", "ok"),
        (0, "made.json,missing.json", "failed"),  # exit 0 without its result file
        (1, "made.json", "failed"),
        (124, "made.json", "timeout"),  # SIGTERM from `timeout`
        (137, "", "timeout"),  # SIGKILL after the grace period
        (-1, "", "skipped"),  # no budget left
    ]
    for rc, expect, status in cases:
        result = report.stage_result(tmp_path, "a", rc, 3.0, 10, expect, "", ["cmd", "x"])
        assert result["status"] == status, (rc, expect)
        assert result["log_tail"] == [f"line {i}" for i in range(25, 40)]
        assert json.loads((tmp_path / "results" / "a.json").read_text()) == result


def test_summary_lists_every_stage_in_order_and_fails_if_any_did(tmp_path: Path) -> None:
    report = _report_module()
    (tmp_path / "logs").mkdir()
    (tmp_path / "stages.txt").write_text("env\ntests\nlm\n")
    for name, rc in (("lm", 0), ("env", 0), ("tests", 1)):
        (tmp_path / "logs" / f"{name}.log").write_text(f"{name} says bye\n")
        report.stage_result(tmp_path, name, rc, 2.0, 10, "", "", ["true"])
    assert report.summary(tmp_path, "test", 60) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["stage"] for s in summary["stages"]] == ["env", "tests", "lm"]
    assert not summary["all_ok"] and summary["total_s"] == 6.0
    md = (tmp_path / "summary.md").read_text()
    assert "| tests | failed | 1 |" in md and "## tests: failed" in md and "tests says bye" in md
    (tmp_path / "logs" / "tests.log").write_text("fixed\n")
    report.stage_result(tmp_path, "tests", 0, 2.0, 10, "", "", ["true"])
    assert report.summary(tmp_path, "test", 60) == 0
