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


def test_step_timing_decides_auto() -> None:
    """A model whose step is slower under bf16 autocast trains in fp32, whatever matmuls say."""
    dtype, reason = prec.choose_by_step_time({"fp32": 0.076, "bf16": 0.142}, "matmul 2.0x")
    assert dtype is None and "auto -> fp32" in reason and "76 ms" in reason and "0.54x" in reason
    dtype, reason = prec.choose_by_step_time({"fp32": 0.48, "bf16": 0.22}, "matmul 2.0x")
    assert dtype is torch.bfloat16 and "2.18x" in reason


class _NormTagger(torch.nn.Module):
    """TinyTagger-like, with BatchNorm (running statistics) and dropout (random draws)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 16)
        self.norm = torch.nn.BatchNorm1d(16)
        self.drop = torch.nn.Dropout(0.3)
        self.out = torch.nn.Linear(16, 5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(tokens).transpose(1, 2)).transpose(1, 2)  # (B, T, 16)
        return self.out(self.drop(h))


def test_auto_times_the_real_step_leaves_the_model_untouched_and_resume_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _tiny_task import TinyData, step_fn

    from attnlab.train import TrainConfig, Trainer
    from attnlab.train import engine as eng

    fake_cpu(monkeypatch, flags=True, speedup=2.0)
    seen: list[dict] = []

    def timed(run_step, repeats: int = 3) -> dict[str, float]:
        before = {k: v.clone() for k, v in model.state_dict().items()}
        out = prec.time_step_precisions(run_step, repeats=1)
        after = model.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)  # weights and BN stats
        assert all(p.grad is None for p in model.parameters())
        seen.append(out)
        return {"fp32": 1.0, "bf16": 0.5}  # pretend bf16 halves this step

    monkeypatch.setattr(eng, "time_step_precisions", timed)
    torch.manual_seed(0)
    model = _NormTagger()
    cfg = TrainConfig(
        max_steps=2, batch_size=8, precision="auto", tensorboard=False, checkpoint_every=1
    )
    summary = Trainer(model, cfg, tmp_path, TinyData(), step_fn).fit()
    assert len(seen) == 1 and set(seen[0]) == {"fp32", "bf16"} and summary["precision"] == "bf16"
    assert "training step" in summary["precision_reason"]

    def no_timing(*args, **kwargs):
        raise AssertionError("a resumed run must keep its first precision, not time again")

    monkeypatch.setattr(eng, "time_step_precisions", no_timing)
    more = TrainConfig(**(cfg.__dict__ | {"max_steps": 3}))
    resumed = Trainer(model, more, tmp_path, TinyData(), step_fn).fit(resume=True)
    assert resumed["precision"] == "bf16" and "first start" in resumed["precision_reason"]
