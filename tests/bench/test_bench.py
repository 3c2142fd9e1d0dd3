"""The benchmark package: exponent fit, the guards, an isolated measurement, the report."""

from __future__ import annotations

import pytest

from attnlab.bench.command import run_bench
from attnlab.bench.memory import run_isolated
from attnlab.bench.scaling import fit_exponent, run_scaling


def test_fit_exponent_recovers_a_power_law():
    pts = [(t, 3.0 * t**2) for t in (256, 512, 1024, 2048)]
    assert fit_exponent(pts, fit_from=512) == pytest.approx(2.0)
    assert fit_exponent([(t, 5.0 * t) for t in (512, 1024)], fit_from=512) == pytest.approx(1.0)
    assert fit_exponent(pts, fit_from=4096) is None


def test_scaling_skips_points_over_the_memory_guard_without_running_them():
    result = run_scaling([512], kinds=("explicit",), mem_limit_gib=1e-6, log=lambda _: None)
    (row,) = result["points"]["explicit"]
    assert "GiB > limit" in row["skipped"] and "ms" not in row


def test_isolated_measurement_of_a_small_block():
    spec = dict(case="block", kind="local", T=128, batch=1, d_model=32, n_heads=2, window=16,
                threads=1, repeats=1, time_cap_s=5.0)  # fmt: skip
    res = run_isolated(spec, timeout_s=120)
    assert "error" not in res, res
    assert res["median_ms"] > 0 and res["steps_timed"] == 1 and res["hwm_reset"] in (True, False)
    assert "error" in run_isolated({**spec, "case": "nope"}, timeout_s=120)


def test_bench_rejects_unknown_sections_and_writes_a_report(tmp_path):
    with pytest.raises(ValueError, match="unknown bench sections"):
        run_bench(tmp_path / "r.md", quick=True, sections=("kernelz",))
    out = run_bench(tmp_path / "r.md", quick=True, sections=("mha",), log=lambda _: None)
    text = out.read_text()
    assert "GFLOP/s" in text and "precision" in text and "nn.MultiheadAttention" in text
    assert out.with_suffix(".json").exists()
