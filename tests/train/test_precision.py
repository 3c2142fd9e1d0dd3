"""Precision chooser: decisions from injected CPU and CUDA evidence (capability, step
timings), agreement with this machine, TF32 settings, and the fp16 + GradScaler path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab.errors import UserError
from attnlab.train import precision as prec
from attnlab.train import precision_record
from attnlab.train.precision import choose_precision, cpu_bf16_flags, inference_dtype

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu avx avx2 avx512f avx512_bf16 amx_tile\n"


def fake_cpu(monkeypatch: pytest.MonkeyPatch, flags: bool | None) -> None:
    """Make the CPU report native bf16 (True), none (False) or unknown flags (None)."""
    monkeypatch.setattr(prec, "cpu_bf16_flags", lambda: flags)


def test_cpuinfo_parsing(tmp_path: Path) -> None:
    (tmp_path / "avx2").write_text(AVX2_ONLY)
    (tmp_path / "bf16").write_text(AVX512_BF16)
    (tmp_path / "empty").write_text("processor : 0\n")
    assert cpu_bf16_flags(tmp_path / "avx2") is False
    assert cpu_bf16_flags(tmp_path / "bf16") is True
    assert cpu_bf16_flags(tmp_path / "empty") is None
    assert cpu_bf16_flags(tmp_path / "missing") is None
    assert prec.cpu_bf16_flag_names(tmp_path / "bf16") == ["avx512_bf16"]
    assert prec.cpu_bf16_flag_names(tmp_path / "missing") == []


def test_auto_candidate_follows_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cpu(monkeypatch, flags=False)
    dtype, reason = choose_precision("cpu", "auto")
    assert dtype is None and "fp32" in reason and "avx512_bf16" in reason
    for flags in (True, None):
        fake_cpu(monkeypatch, flags=flags)
        dtype, reason = choose_precision("cpu", "auto")
        assert dtype is torch.bfloat16 and reason.startswith("auto -> bf16: CPU")


def test_a_forward_pass_before_timing_takes_bf16_only_where_the_cpu_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """auto: bf16 on native bf16 only (unknown flags may mean emulation, which is slower than
    fp32 for a pass that is never timed); an explicit precision is kept."""
    for flags, want in ((True, torch.bfloat16), (None, None), (False, None)):
        fake_cpu(monkeypatch, flags=flags)
        assert inference_dtype("cpu", "auto") is want, flags
        assert inference_dtype("cpu", "fp32") is None
        assert inference_dtype("cpu", "bf16") is torch.bfloat16


def test_explicit_bf16_on_cpu_without_bf16_warns_but_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cpu(monkeypatch, flags=False)
    with pytest.warns(UserWarning, match="slow"):
        dtype, _ = choose_precision("cpu", "bf16")
    assert dtype is torch.bfloat16


def test_explicit_choices_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_precision("cpu", "fp32") == (None, "fp32 requested")
    with pytest.raises(UserError, match="auto, fp32, bf16, fp16"):
        choose_precision("cpu", "half")


@pytest.mark.parametrize(("flags", "fix"), [(True, "bf16"), (False, "fp32")])
def test_fp16_off_cuda_is_one_line_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch, flags: bool, fix: str
) -> None:
    """fp16 trains only through CUDA's GradScaler path: refused as a UserError (one line, exit
    2 on the command line) by the check the runner makes before anything is built."""
    fake_cpu(monkeypatch, flags=flags)
    for call in (prec.check_precision, lambda p, d: choose_precision(d, p)):
        with pytest.raises(UserError) as err:
            call("fp16", "cpu")
        line = str(err.value)
        assert "\n" not in line and "needs a CUDA GPU" in line and f"--precision {fix}" in line
    prec.check_precision("fp16", "cuda")  # accepted: the GPU decides at training time


def test_this_machine_auto_matches_its_own_flags() -> None:
    """auto tries bf16 here iff the CPU does not lack native bf16."""
    flags = cpu_bf16_flags()
    dtype, reason = choose_precision("cpu", "auto")
    print(f"flags={flags} reason={reason}")
    assert dtype is (None if flags is False else torch.bfloat16)


def test_step_timing_decides_auto() -> None:
    """A model whose step is slower under bf16 autocast trains in fp32, whatever matmuls say."""
    dtype, reason = prec.choose_by_step_time({"fp32": 0.076, "bf16": 0.142}, "matmul 2.0x")
    assert dtype is None and "auto -> fp32" in reason and "76.0 ms" in reason and "0.54x" in reason
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

    fake_cpu(monkeypatch, flags=True)
    seen: list[dict] = []

    def timed(run_step, names, **kwargs) -> dict[str, float]:
        before = {k: v.clone() for k, v in model.state_dict().items()}
        out = prec.time_step_precisions(run_step, names, repeats=1, **kwargs)
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


# --------------------------------------------------------------------------- CUDA decisions


def fake_gpu(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]) -> None:
    """Make `cuda` report a GPU of this compute capability (no GPU needed)."""
    monkeypatch.setattr(prec, "cuda_capability", lambda device: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")


def test_cuda_auto_candidate_is_bf16_where_native_else_fp16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_gpu(monkeypatch, (9, 0))
    dtype, reason = choose_precision("cuda", "auto")
    assert dtype is torch.bfloat16 and "Test GPU (compute capability 9.0) has native bf16" in reason
    assert prec.make_grad_scaler(torch.device("cuda"), dtype) is None
    fake_gpu(monkeypatch, (7, 5))  # Turing: bf16 only emulated
    dtype, reason = choose_precision("cuda", "auto")
    assert dtype is torch.float16 and "lacks native bf16" in reason and "GradScaler" in reason
    with pytest.warns(UserWarning, match="no native bf16"):
        assert choose_precision("cuda", "bf16")[0] is torch.bfloat16
    assert choose_precision("cuda", "fp16") == (torch.float16, "fp16 requested")
    assert choose_precision("cuda", "fp32") == (None, "fp32 requested")


def test_step_timing_decides_between_fp32_and_fp16() -> None:
    dtype, reason = prec.choose_by_step_time({"fp32": 0.010, "fp16": 0.004}, "old GPU", "fp16")
    assert dtype is torch.float16 and reason.startswith("auto -> fp16: old GPU;")
    assert "2.50x" in reason
    dtype, reason = prec.choose_by_step_time({"fp32": 0.0021, "fp16": 0.0020}, "old GPU", "fp16")
    assert dtype is None and "auto -> fp32" in reason and "1.05x" in reason


def test_step_timing_synchronises_around_every_timed_step() -> None:
    """On CUDA the clock must wait for the device: sync before and after each timed call."""
    events: list[str] = []
    clock_reads: list[int] = []

    def run_step(dtype: torch.dtype | None) -> None:
        events.append(f"step {prec.precision_name(dtype)}")

    def sync() -> None:
        events.append("sync")
        clock_reads.append(len(events))

    out = prec.time_step_precisions(run_step, ("fp32", "fp16"), repeats=2, sync=sync)
    assert set(out) == {"fp32", "fp16"} and all(t >= 0 for t in out.values())
    warmup, timed = events[:2], events[2:]
    assert warmup == ["step fp32", "step fp16"]  # untimed warm-up of each
    assert timed == ["sync", "step fp32", "sync", "sync", "step fp16", "sync"] * 2
    assert prec.synchronizer(torch.device("cpu"))() is None


def test_tf32_is_stated_and_set_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    before = prec.tf32_flags()
    try:
        assert "not applicable on CPU" in prec.configure_tf32(torch.device("cpu"), "auto")
        assert prec.tf32_flags() == before  # the CPU run leaves torch's flags alone
        fake_gpu(monkeypatch, (9, 0))
        note = prec.configure_tf32(torch.device("cuda"), "auto")
        assert prec.tf32_flags() == (True, True)
        assert note.startswith("TF32 on") and "torch.backends.cuda.matmul.allow_tf32=True" in note
        note = prec.configure_tf32(torch.device("cuda"), "fp32")
        assert prec.tf32_flags() == (False, False) and "IEEE fp32" in note
        fake_gpu(monkeypatch, (7, 0))
        note = prec.configure_tf32(torch.device("cuda"), "bf16")
        assert prec.tf32_flags() == (False, False) and "no TF32" in note
    finally:
        prec.restore_tf32(before)
    assert prec.tf32_flags() == before


def test_fp16_auto_trains_through_the_grad_scaler_and_resume_restores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fp16 path (a GPU without bf16), run on CPU with the decision injected: the step is
    timed against fp32, fp16 wins, training runs under fp16 autocast through a GradScaler
    (overflowing steps skipped and the scale backed off), its state is checkpointed and
    restored on resume."""
    from _tiny_task import TinyData, TinyTagger, step_fn

    from attnlab.train import TrainConfig, Trainer
    from attnlab.train import engine as eng

    timed_names: list[tuple[str, ...]] = []

    def decide(device, requested):
        assert requested == "auto"
        return torch.float16, "auto -> fp16: injected GPU without native bf16"

    def timed(run_step, names, **kwargs) -> dict[str, float]:
        timed_names.append(tuple(names))
        prec.time_step_precisions(run_step, names, repeats=1, **kwargs)  # runs fp16 for real
        return {"fp32": 1.0, "fp16": 0.5}

    monkeypatch.setattr(eng, "choose_precision", decide)
    monkeypatch.setattr(eng, "time_step_precisions", timed)
    torch.manual_seed(0)
    model = TinyTagger()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = TrainConfig(
        max_steps=6, batch_size=8, precision="auto", tensorboard=False, checkpoint_every=1
    )
    trainer = Trainer(model, cfg, tmp_path, TinyData(), step_fn)
    summary = trainer.fit()
    assert timed_names == [("fp32", "fp16")]
    assert summary["precision"] == "fp16" and "training step" in summary["precision_reason"]
    assert isinstance(trainer.scaler, torch.amp.GradScaler)
    saved = json.loads((tmp_path / "state" / "trainer.json").read_text())["scaler"]
    # the first steps overflow in fp16 and are skipped (scale backs off), later ones apply
    assert saved["scale"] < 2.0**16 and saved["_growth_tracker"] >= 1
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())
    assert not torch.equal(start["out.weight"], model.state_dict()["out.weight"])

    resumed = Trainer(model, cfg, tmp_path, TinyData(), step_fn)
    summary = resumed.fit(resume=True)  # finished already: loads the state, trains no more
    assert summary["precision"] == "fp16" and "needs CUDA" in summary["precision_reason"]
    assert resumed.scaler is not None and resumed.scaler.state_dict() == saved


class _FailsInBf16(_NormTagger):
    """Raises in the backward pass under bf16 autocast, as an op without a bf16 kernel would."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = super().forward(tokens)
        if torch.is_autocast_enabled("cpu"):
            return _RaiseInBackward.apply(out)
        return out


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("expected m1 and m2 to have the same dtype: float != BFloat16")


def test_auto_falls_back_to_fp32_when_the_step_fails_in_bf16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    """A low precision that crashes the probe step is dropped, with one line,
    and the run trains in fp32 from an untouched model (no stale gradients, BN stats kept)."""
    from _tiny_task import TinyData, step_fn

    from attnlab.train import TrainConfig, Trainer

    fake_cpu(monkeypatch, flags=True)
    torch.manual_seed(0)
    model = _FailsInBf16()
    cfg = TrainConfig(max_steps=1, batch_size=8, precision="auto", tensorboard=False)
    summary = Trainer(model, cfg, tmp_path, TinyData(), step_fn).fit()
    assert summary["precision"] == "fp32"
    assert "fails under bf16 autocast" in summary["precision_reason"]
    lines = [ln for ln in capfd.readouterr().err.splitlines() if "falling back to fp32" in ln]
    assert len(lines) == 1 and "float != BFloat16" in lines[0]


# --------------------------------------------------------------------------- decided once


def _fit_auto(
    run_dir: Path, timings: dict[str, float] | None, monkeypatch, threads: int = 1, rows: int = 8
):
    """A fresh start of the tiny task under precision auto on a CPU with native bf16, the step
    timings injected (None: any timing fails the test); returns (summary, timings asked)."""
    from _tiny_task import TinyData, TinyTagger, step_fn

    from attnlab.train import TrainConfig, Trainer
    from attnlab.train import engine as eng

    fake_cpu(monkeypatch, flags=True)
    asked: list[tuple[str, ...]] = []

    def timed(run_step, names, **kwargs) -> dict[str, float]:
        asked.append(tuple(names))
        assert timings is not None, "this start must read the recorded choice, not time"
        return dict(timings)

    monkeypatch.setattr(eng, "time_step_precisions", timed)
    torch.manual_seed(0)
    cfg = TrainConfig(
        max_steps=1, batch_size=8, precision="auto", tensorboard=False, num_threads=threads
    )
    return Trainer(TinyTagger(), cfg, run_dir, TinyData(batch_size=rows), step_fn).fit(), asked


def test_auto_is_decided_once_and_a_loaded_machine_cannot_flip_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision_record_file: Path
) -> None:
    """The first start times the step and records the choice; a later fresh start of the same
    setting reads it, even where its own timing (a loaded machine) would say otherwise."""
    first, asked = _fit_auto(tmp_path / "a", {"fp32": 1.0, "bf16": 0.5}, monkeypatch)
    assert asked == [("fp32", "bf16")] and first["precision"] == "bf16"
    assert "fp32 1000.0 ms, bf16 500.0 ms: 2.00x" in first["precision_reason"]
    assert f"recorded in {precision_record_file}" in first["precision_reason"]
    (entry,) = json.loads(precision_record_file.read_text()).values()
    assert entry["precision"] == "bf16"
    assert entry["timing"] == "fp32 1000.0 ms, bf16 500.0 ms: 2.00x"
    second, asked = _fit_auto(tmp_path / "b", None, monkeypatch)
    assert asked == [] and second["precision"] == "bf16"
    assert "was timed on" in second["precision_reason"] and "2.00x" in second["precision_reason"]


def test_a_new_setting_or_an_unreadable_record_is_timed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision_record_file: Path
) -> None:
    _fit_auto(tmp_path / "a", {"fp32": 1.0, "bf16": 0.5}, monkeypatch, threads=1)
    other, asked = _fit_auto(tmp_path / "b", {"fp32": 1.0, "bf16": 2.0}, monkeypatch, threads=2)
    assert asked == [("fp32", "bf16")] and other["precision"] == "fp32"  # its own measurement
    keys = list(json.loads(precision_record_file.read_text()))
    assert len(keys) == 2 and {"1 threads" in k for k in keys} == {True, False}
    wider, asked = _fit_auto(tmp_path / "w", {"fp32": 1.0, "bf16": 0.5}, monkeypatch, rows=16)
    assert asked == [("fp32", "bf16")]  # another micro-batch shape is another setting
    keys = list(json.loads(precision_record_file.read_text()))
    assert len(keys) == 3 and sum("tokens 16x" in k for k in keys) == 1
    device = precision_record.device_description("cpu")
    assert all(device in k and torch.__version__ in k for k in keys)
    records = json.loads(precision_record_file.read_text())
    precision_record_file.write_text(json.dumps({k: {"precision": "bf16"} for k in records}))
    _, asked = _fit_auto(tmp_path / "c0", {"fp32": 1.0, "bf16": 0.5}, monkeypatch, threads=2)
    assert asked == [("fp32", "bf16")]  # an entry without its evidence is no record
    precision_record_file.write_text("{not json")
    again, asked = _fit_auto(tmp_path / "c", {"fp32": 1.0, "bf16": 0.5}, monkeypatch)
    assert asked == [("fp32", "bf16")] and "is unreadable" in again["precision_reason"]
    assert len(json.loads(precision_record_file.read_text())) == 1  # rewritten whole


def test_a_record_that_cannot_be_written_is_said_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(precision_record, "data_dir", lambda: blocker / "cache")
    summary, _ = _fit_auto(tmp_path / "run", {"fp32": 1.0, "bf16": 0.5}, monkeypatch)
    assert summary["precision"] == "bf16" and "not recorded" in summary["precision_reason"]
    assert summary["steps"] == 1
