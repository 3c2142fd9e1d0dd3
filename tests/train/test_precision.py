"""Precision chooser: decisions from injected CPU evidence, and agreement with this machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.train import precision as prec
from attnlab.train.precision import choose_precision, cpu_bf16_flags

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu avx avx2 avx512f avx512_bf16 amx_tile\n"


def fake_cpu(monkeypatch: pytest.MonkeyPatch, flags: bool | None, speedup: float) -> list:
    """Make the CPU report `flags` and time bf16 at `speedup`; return the list of timing calls."""
    calls: list[int] = []

    def timed() -> float:
        calls.append(1)
        return speedup

    monkeypatch.setattr(prec, "cpu_bf16_flags", lambda: flags)
    monkeypatch.setattr(prec, "bf16_matmul_speedup", timed)
    return calls


def test_cpuinfo_parsing(tmp_path: Path) -> None:
    (tmp_path / "avx2").write_text(AVX2_ONLY)
    (tmp_path / "bf16").write_text(AVX512_BF16)
    (tmp_path / "empty").write_text("processor : 0\n")
    assert cpu_bf16_flags(tmp_path / "avx2") is False
    assert cpu_bf16_flags(tmp_path / "bf16") is True
    assert cpu_bf16_flags(tmp_path / "empty") is None
    assert cpu_bf16_flags(tmp_path / "missing") is None


def test_auto_on_avx2_cpu_is_fp32_without_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_cpu(monkeypatch, flags=False, speedup=0.01)
    dtype, reason = choose_precision("cpu", "auto")
    assert dtype is None and "fp32" in reason and "avx512_bf16" in reason
    assert calls == []  # no native bf16: no need to time anything


@pytest.mark.parametrize("flags", [True, None])
def test_auto_on_cpu_follows_the_measurement(
    monkeypatch: pytest.MonkeyPatch, flags: bool | None
) -> None:
    fake_cpu(monkeypatch, flags=flags, speedup=0.9)
    dtype, reason = choose_precision("cpu", "auto")
    assert dtype is None and "0.90x" in reason
    fake_cpu(monkeypatch, flags=flags, speedup=2.5)
    dtype, reason = choose_precision("cpu", "auto")
    assert dtype is torch.bfloat16 and "2.50x" in reason


def test_explicit_bf16_on_slow_cpu_warns_but_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cpu(monkeypatch, flags=False, speedup=0.01)
    with pytest.warns(UserWarning, match="slow"):
        dtype, _ = choose_precision("cpu", "bf16")
    assert dtype is torch.bfloat16


def test_explicit_choices_and_errors() -> None:
    assert choose_precision("cpu", "fp32") == (None, "fp32 requested")
    with pytest.raises(ValueError, match="fp16.*CUDA"):
        choose_precision("cpu", "fp16")
    with pytest.raises(ValueError, match="auto, fp32, bf16, fp16"):
        choose_precision("cpu", "half")


def test_this_machine_auto_matches_its_own_evidence() -> None:
    """auto picks bf16 here iff the CPU has native bf16 and bf16 measured >= 1.25x faster."""
    flags = cpu_bf16_flags()
    fast = flags is not False and prec.bf16_matmul_speedup() >= prec.MIN_BF16_SPEEDUP
    dtype, reason = choose_precision("cpu", "auto")
    print(f"flags={flags} reason={reason}")
    assert dtype is (torch.bfloat16 if fast else None)
    if flags is False:
        assert dtype is None, "an AVX2-only CPU must train in fp32 under auto"


def test_probe_leaves_global_rng_alone() -> None:
    prec.bf16_matmul_speedup.cache_clear()
    before = torch.get_rng_state()
    prec.bf16_matmul_speedup(size=32, repeats=1)
    assert torch.equal(before, torch.get_rng_state())
