"""Trainer semantics in-process: exact weighting, determinism, early stopping, best weights,
outputs (metrics.jsonl, TensorBoard, curves, summary), Ctrl-C resume, and input errors."""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path

import pytest
import torch
from _tiny_task import TinyData, TinyTagger, make_evaluate, make_split, step_fn
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

from _device import DEVICE
from attnlab.train import StepOutput, TrainConfig, seed_everything
from attnlab.train import Trainer as EngineTrainer
from attnlab.train.metrics_log import read_metrics
from attnlab.train.schedules import lr_factor

pytestmark = pytest.mark.usefixtures("deterministic")


class Trainer(EngineTrainer):
    """The engine's Trainer, run on the device under test (tests/_device.py)."""

    def __init__(self, *args, device: str | torch.device = DEVICE, **kwargs) -> None:
        super().__init__(*args, device=device, **kwargs)


TIMING = {"elapsed_s", "tokens_per_s"}


def cfg_for(**kw) -> TrainConfig:
    base = {
        "epochs": 2,
        "batch_size": 8,
        "lr": 3e-2,
        "warmup_steps": 2,
        "log_every": 1,
        "checkpoint_every": 4,
        "precision": "fp32",
        "tensorboard": False,
        "num_threads": 1,
    }
    return TrainConfig(**(base | kw))


def tiny(dropout: float = 0.0, dtype: torch.dtype = torch.float32) -> TinyTagger:
    seed_everything(0)
    return TinyTagger(dropout=dropout).to(dtype)


def without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


class FixedData(TinyData):
    """TinyData with a fixed list of global micro-batches every epoch."""

    def __init__(self, batches: list[list[int]]) -> None:
        super().__init__()
        self.fixed = batches

    def batches(self, epoch: int) -> list[list[int]]:
        return self.fixed


def test_grad_accum_equals_concatenated_batch_exactly(tmp_path: Path) -> None:
    """3 steps of grad_accum=2 over unequal micro-batches == 3 steps on the concatenations."""
    micro = [
        list(range(0, 3)),
        list(range(3, 11)),
        list(range(11, 15)),
        list(range(15, 17)),
        list(range(17, 23)),
        [23],
    ]
    merged = [micro[0] + micro[1], micro[2] + micro[3], micro[4] + micro[5]]
    data = TinyData()
    weights = [int((data.split["targets"][m] != -100).sum()) for m in micro]
    assert all(weights[i] != weights[i + 1] for i in (0, 2, 4)), "need unequal token counts"

    runs = {}
    for name, batches, accum in (("accum", micro, 2), ("merged", merged, 1)):
        model = tiny(dtype=torch.float64)
        cfg = cfg_for(grad_accum=accum, clip_norm=0.0, epochs=1)
        Trainer(model, cfg, tmp_path / name, FixedData(batches), step_fn).fit()
        runs[name] = (model.state_dict(), read_metrics(tmp_path / name / "metrics.jsonl"))

    (w_acc, m_acc), (w_mrg, m_mrg) = runs["accum"], runs["merged"]
    for key in w_acc:
        torch.testing.assert_close(w_acc[key], w_mrg[key], rtol=0, atol=1e-12)
    for a, b in zip(m_acc, m_mrg):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-12)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-10)

    # The test is sensitive: averaging the two micro-batch means (the classic bug) gives a
    # clearly different first gradient than the token-weighted mean the engine computes.
    model = tiny(dtype=torch.float64)
    batches = [data.collate(m) for m in micro[:2]]
    grads = []
    for batch in batches:
        model.zero_grad()
        step_fn(model, batch).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    naive = (grads[0] + grads[1]) / 2
    exact = (grads[0] * weights[0] + grads[1] * weights[1]) / (weights[0] + weights[1])
    assert exact.norm().item() == pytest.approx(m_acc[0]["grad_norm"], rel=1e-10)
    assert abs(naive.norm().item() - m_acc[0]["grad_norm"]) > 1e-3


def test_same_seed_same_run_different_seed_different(tmp_path: Path) -> None:
    results = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        model = tiny(dropout=0.2)
        cfg = cfg_for(seed=seed)
        data = TinyData(seed=seed)
        Trainer(model, cfg, tmp_path / name, data, step_fn, evaluate=make_evaluate()).fit()
        results.append(
            (model.state_dict(), without_timing(read_metrics(tmp_path / name / "metrics.jsonl")))
        )
    (wa, ma), (wb, mb), (wc, mc) = results
    assert ma == mb
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert ma != mc and not all(torch.equal(wa[k], wc[k]) for k in wa)


class ScriptedEval:
    """evaluate() that returns scripted monitor values and remembers the weights it saw."""

    def __init__(self, key: str, values: list[float]) -> None:
        self.key, self.values, self.seen = key, values, []

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        self.seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return {self.key: self.values[len(self.seen) - 1], "other": 0.0}


@pytest.mark.parametrize(
    "mode,values,best_idx",
    [
        ("min", [1.0, 0.5, 0.7, 0.6, 0.4, 0.3], 1),
        ("max", [0.1, 0.9, 0.8, 0.85, 0.95, 0.99], 1),
    ],
)
def test_early_stopping_and_best_weights(
    tmp_path: Path, mode: str, values: list[float], best_idx: int
) -> None:
    scripted = ScriptedEval("score", values)
    cfg = cfg_for(eval_every=1, patience=2, monitor="score", monitor_mode=mode, epochs=5)
    model = tiny()
    summary = Trainer(model, cfg, tmp_path, TinyData(), step_fn, evaluate=scripted).fit()
    assert summary["stop_reason"] == "early_stop"
    assert summary["steps"] == 4 and len(scripted.seen) == 4  # best at 2, then 2 bad evals
    assert summary["best_step"] == best_idx + 1 and summary["best_metric"] == values[best_idx]
    best = load_file(str(tmp_path / "model.safetensors"), device=str(DEVICE))
    for key, value in scripted.seen[best_idx].items():
        assert torch.equal(best[key], value), f"model.safetensors is not the step-2 weights ({key})"
    assert not torch.equal(best["out.weight"], model.state_dict()["out.weight"])
    val = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "val"]
    assert [r["best"] for r in val] == [True, True, False, False]


def test_without_evaluate_saves_last_weights(tmp_path: Path) -> None:
    model = tiny()
    summary = Trainer(model, cfg_for(max_steps=5), tmp_path, TinyData(), step_fn).fit()
    assert summary["stop_reason"] == "max_steps" and summary["steps"] == 5
    assert summary["best_metric"] is None
    saved = load_file(str(tmp_path / "model.safetensors"), device=str(DEVICE))
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_outputs_metrics_tensorboard_curves(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("matplotlib")
    cfg = cfg_for(log_every=3, tensorboard=True, warmup_ratio=0.25, warmup_steps=0)
    summary = Trainer(tiny(), cfg, tmp_path, TinyData(), step_fn, make_evaluate()).fit()
    records = read_metrics(tmp_path / "metrics.jsonl")
    train = [r for r in records if r["split"] == "train"]
    val = [r for r in records if r["split"] == "val"]
    assert [r["step"] for r in train] == [3, 6, 9, 12, 15, 18, 21, 24]
    assert [r["step"] for r in val] == [12, 24]  # end of each epoch
    for r in train:
        assert {
            "step",
            "epoch",
            "loss",
            "acc",
            "lr",
            "grad_norm",
            "tokens_per_s",
            "elapsed_s",
            "precision",
        } <= set(r)
        assert r["precision"] == "fp32" and r["tokens_per_s"] > 0
    assert train[0]["lr"] == pytest.approx(3e-2 * 3 / 6)  # warmup = round(0.25 * 24) = 6 steps
    assert {"val_loss", "val_acc"} <= set(val[0])
    assert summary["steps"] == 24 and summary["epochs"] == 2 and summary["stop_reason"] == "epochs"
    assert summary["precision"] == "fp32" and summary["best_metric"] == min(
        r["val_loss"] for r in val
    )
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "state" / "COMPLETE").exists()


def test_tokens_per_s_counts_non_pad_tokens(tmp_path: Path) -> None:
    """With one step per log event, tokens/s * window time must be the step's token count."""
    Trainer(tiny(), cfg_for(epochs=1), tmp_path, TinyData(), step_fn).fit()
    first = read_metrics(tmp_path / "metrics.jsonl")[0]
    data = TinyData()
    expected = data.num_tokens(data.collate(data.batches(0)[0]))
    assert first["tokens_per_s"] * first["elapsed_s"] == pytest.approx(expected, rel=1e-6)


def test_explicit_bf16_on_cpu_runs_and_is_recorded(tmp_path: Path) -> None:
    cfg = cfg_for(precision="bf16", max_steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 warns only on CPUs where it is slow
        summary = Trainer(tiny(), cfg, tmp_path, TinyData(), step_fn).fit()
    assert summary["precision"] == "bf16"
    assert {r["precision"] for r in read_metrics(tmp_path / "metrics.jsonl")} == {"bf16"}


class WeightCasts(TorchDispatchMode):
    """Counts the copies of the given parameters to bf16 (autocast's weight casts)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        super().__init__()
        self.ptrs = {p.data_ptr() for p in params}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16:
            self.count += args[0].data_ptr() in self.ptrs
        return func(*args, **kwargs)


def test_bf16_casts_each_weight_once_a_step_and_keeps_the_step(tmp_path: Path) -> None:
    """Under bf16 autocast with two micro-batches a step, autocast's cache of cast weights
    serves both: each weight is cast once a step, and the step's gradient is the one separate
    autocast contexts around each micro-batch give (the cast values are the same)."""
    micro = [list(range(0, 5)), list(range(5, 13)), list(range(13, 16)), list(range(16, 24))]
    model = tiny()
    cast = [model.hidden.weight, model.hidden.bias, model.out.weight, model.out.bias]
    reference = tiny()
    data = TinyData()
    grads, total = [], 0
    for indices in micro[:2]:  # the first step, each micro-batch in its own context
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = step_fn(reference, data.collate(indices))
        (out.loss * out.weight).backward()
        total += out.weight
    grads = [p.grad / total for p in reference.parameters()]
    expected_norm = torch.cat([g.flatten() for g in grads]).norm().item()

    cfg = cfg_for(precision="bf16", grad_accum=2, clip_norm=0.0, epochs=1)
    with WeightCasts(cast) as casts, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 warns only on CPUs where it is slow
        Trainer(model, cfg, tmp_path, FixedData(micro), step_fn, device="cpu").fit()
    assert casts.count == len(cast) * 2  # two steps, each weight cast once in each
    first = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert first["grad_norm"] == pytest.approx(expected_norm, rel=1e-6)


class InterruptAt:
    """step_fn that raises KeyboardInterrupt on its n-th call (simulated Ctrl-C)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, model: torch.nn.Module, batch: dict) -> StepOutput:
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return step_fn(model, batch)


def test_ctrl_c_writes_checkpoint_and_resume_is_exact(tmp_path: Path) -> None:
    """Ctrl-C three times: in the very first micro-batch (checkpoint of step 0), in the 2nd
    micro-batch of a step at an epoch start (checkpoint of the previous step, with the RNG as it
    was then although dropout has consumed some since), and mid-epoch between periodic
    checkpoints. Each time the run resumes; the end result must match an unbroken run bitwise."""
    cfg = cfg_for(grad_accum=2, checkpoint_every=100, epochs=2)
    ref_model = tiny(dropout=0.3)
    Trainer(ref_model, cfg, tmp_path / "ref", TinyData(), step_fn, make_evaluate()).fit()

    run = tmp_path / "run"
    # (interrupt at this step_fn call of the process, expected (step, epoch, batch_pos) saved)
    legs = [(1, (0, 0, 0)), (14, (6, 1, 0)), (5, (8, 1, 4))]  # 6 steps of 2 micro-batches/epoch
    for leg, (call, expected) in enumerate(legs):
        trainer = Trainer(
            tiny(dropout=0.3), cfg, run, TinyData(), InterruptAt(call), make_evaluate()
        )
        with pytest.raises(KeyboardInterrupt):
            trainer.fit(resume=leg > 0)
        saved = json.loads((run / "state" / "trainer.json").read_text())["loop"]
        assert (saved["step"], saved["epoch"], saved["batch_pos"]) == expected, leg

    model = tiny(dropout=0.3)  # as in a fresh process: weights come from the checkpoint
    Trainer(model, cfg, run, TinyData(), step_fn, make_evaluate()).fit(resume=True)
    assert all(torch.equal(v, ref_model.state_dict()[k]) for k, v in model.state_dict().items())
    assert without_timing(read_metrics(run / "metrics.jsonl")) == without_timing(
        read_metrics(tmp_path / "ref" / "metrics.jsonl")
    )


def test_resume_of_finished_run_is_a_no_op(tmp_path: Path) -> None:
    cfg = cfg_for(max_steps=3)
    first = Trainer(tiny(), cfg, tmp_path, TinyData(), step_fn).fit()
    again = Trainer(tiny(), cfg, tmp_path, TinyData(), step_fn).fit(resume=True)
    assert again["steps"] == first["steps"] == 3 and again["stop_reason"] == "max_steps"


def test_bad_inputs_raise_clear_errors(tmp_path: Path) -> None:
    data = TinyData()
    with pytest.raises(ValueError, match="TrainConfig"):
        Trainer(tiny(), {"lr": 1}, tmp_path, data, step_fn)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batches"):
        Trainer(tiny(), cfg_for(), tmp_path, object(), step_fn)  # type: ignore[arg-type]

    def vector_loss(model: torch.nn.Module, batch: dict) -> StepOutput:
        out = step_fn(model, batch)
        return StepOutput(loss=out.loss.repeat(2), weight=out.weight)

    with pytest.raises(ValueError, match="scalar"):
        Trainer(tiny(), cfg_for(), tmp_path / "a", data, vector_loss).fit()

    def zero_weight(model: torch.nn.Module, batch: dict) -> StepOutput:
        return StepOutput(loss=step_fn(model, batch).loss, weight=0)

    with pytest.raises(ValueError, match="total weight"):
        Trainer(tiny(), cfg_for(), tmp_path / "b", data, zero_weight).fit()

    with pytest.raises(ValueError, match="val_loss.*'other', 'score'"):
        Trainer(
            tiny(),
            cfg_for(),
            tmp_path / "c",
            data,
            step_fn,
            evaluate=ScriptedEval("score", [1.0] * 10),
        ).fit()

    Trainer(tiny(), cfg_for(max_steps=1), tmp_path / "d", data, step_fn).fit()
    with pytest.raises(ValueError, match="--resume"):
        Trainer(tiny(), cfg_for(max_steps=1), tmp_path / "d", data, step_fn).fit()


def test_split_fixture_has_padding() -> None:
    """The tiny task must have unequal token counts, or the weighting tests prove nothing."""
    lengths = (make_split(96, seed=1234)["targets"] != -100).sum(1)
    assert lengths.min() < lengths.max()


def test_time_budget_stops_after_evaluating(tmp_path: Path) -> None:
    """max_minutes ends the run early, with a final eval and a checkpoint, and says why."""
    cfg = cfg_for(epochs=50, max_minutes=1e-6, eval_every=1000)
    summary = Trainer(tiny(), cfg, tmp_path, TinyData(), step_fn, make_evaluate()).fit()
    assert summary["stop_reason"] == "max_minutes"
    assert summary["steps"] == 1  # the budget is spent after the first step, not 50 epochs
    vals = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "val"]
    assert len(vals) == 1 and vals[0]["step"] == summary["steps"]
    assert (tmp_path / "model.safetensors").exists()


def test_schedule_by_time_decays_within_the_budget(tmp_path: Path, monkeypatch) -> None:
    """With schedule_by_time the lr follows the clock: half the budget spent = half the decay,
    and the run the clock stops ends at the floor instead of mid-schedule."""
    clock = {"t": 0.0}
    monkeypatch.setattr(Trainer, "_elapsed", lambda self: clock["t"])
    cfg = cfg_for(
        epochs=50,
        max_minutes=1.0,
        warmup_steps=0,
        schedule="linear",
        schedule_by_time=True,
        log_every=1,
    )
    trainer = Trainer(tiny(), cfg, tmp_path, TinyData(), step_fn, make_evaluate())
    orig = Trainer._update
    lrs: list[float] = []

    def update(self, step, total_weight):
        clock["t"] += 12.0  # every optimizer step "takes" a fifth of the 60 s budget
        lr, norm = orig(self, step, total_weight)
        lrs.append(lr)
        return lr, norm

    monkeypatch.setattr(Trainer, "_update", update)
    summary = trainer.fit()
    assert summary["stop_reason"] == "max_minutes" and summary["steps"] == 5
    total = trainer.total_steps  # 50 epochs' worth of steps, of which 5 fit the budget
    expected = [cfg.lr * (1 - min(total, math.ceil(k / 5 * total)) / total) for k in range(1, 6)]
    assert lrs == pytest.approx(expected)
    assert lrs[-1] == 0.0


class SlowScriptedEval(ScriptedEval):
    """ScriptedEval that takes `sleep_s` per call, so evaluation time is measurable."""

    def __init__(self, key: str, values: list[float], sleep_s: float) -> None:
        super().__init__(key, values)
        self.sleep_s = sleep_s

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        time.sleep(self.sleep_s)
        return super().__call__(model)


@pytest.mark.parametrize(
    "mode,values,target",
    [("min", [1.0, 0.8, 0.6, 0.5, 0.4], 0.6), ("max", [0.1, 0.5, 0.7, 0.95, 0.99], 0.7)],
)
def test_target_loss_stops_at_the_first_eval_that_reaches_it(
    tmp_path: Path, mode: str, values: list[float], target: float
) -> None:
    scripted = SlowScriptedEval("score", values, sleep_s=0.1)
    cfg = cfg_for(eval_every=1, monitor="score", monitor_mode=mode, epochs=5, target_loss=target)
    summary = Trainer(tiny(), cfg, tmp_path, TinyData(), step_fn, evaluate=scripted).fit()
    assert summary["stop_reason"] == "target_loss" and summary["steps"] == 3
    assert summary["target_reached"] is True and summary["target_step"] == 3
    assert summary["target_loss"] == target and len(scripted.seen) == 3
    # target_time_s is training time: the evaluations' sleeps are left out
    assert summary["eval_time_s"] >= 0.3
    assert 0 < summary["target_time_s"] <= summary["wall_time_s"] - summary["eval_time_s"] + 1e-9
    assert 0 < summary["target_cpu_s"] <= summary["cpu_time_s"] - summary["eval_cpu_s"] + 1e-9
    assert summary["eval_cpu_s"] < summary["eval_time_s"]  # sleeping takes no CPU time
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["target_step"] == 3 and saved["target_time_s"] == summary["target_time_s"]


def test_unreached_target_is_recorded_as_such(tmp_path: Path) -> None:
    cfg = cfg_for(eval_every=2, max_steps=4, target_loss=1e-9)
    summary = Trainer(tiny(), cfg, tmp_path, TinyData(), step_fn, make_evaluate()).fit()
    assert summary["stop_reason"] == "max_steps" and summary["target_reached"] is False
    assert summary["target_step"] is None and summary["target_time_s"] is None
    with pytest.raises(ValueError, match="target_loss needs an evaluate"):
        Trainer(tiny(), cfg, tmp_path / "x", TinyData(), step_fn)


def test_schedule_scales_the_muon_and_the_adamw_groups(tmp_path: Path, monkeypatch) -> None:
    """optimizer=muon: every step, Muon runs at muon_lr * factor and AdamW at lr * factor."""
    cfg = cfg_for(
        optimizer="muon",
        muon_lr=0.05,
        schedule="wsd",
        decay_ratio=0.5,
        warmup_steps=1,
        min_lr_ratio=0.2,
        max_steps=6,
    )
    trainer = Trainer(tiny(), cfg, tmp_path, TinyData(), step_fn, make_evaluate())
    orig = Trainer._update
    seen: list[tuple[list[float], list[float]]] = []

    def update(self, step, total_weight):
        lr, norm = orig(self, step, total_weight)
        muon = [g["lr"] for g in self.optimizer.param_groups if g["use_muon"]]
        adam = [g["lr"] for g in self.optimizer.param_groups if not g["use_muon"]]
        seen.append((muon, adam))
        return lr, norm

    monkeypatch.setattr(Trainer, "_update", update)
    trainer.fit()
    factors = [
        lr_factor(
            k, schedule="wsd", total_steps=6, warmup_steps=1, min_lr_ratio=0.2, decay_ratio=0.5
        )
        for k in range(1, 7)
    ]
    assert factors == pytest.approx([1.0, 1.0, 1.0, 2 / 3 + 0.2 / 3, 1 / 3 + 0.4 / 3, 0.2])
    assert [m for m, _ in seen] == [[pytest.approx(0.05 * f)] for f in factors]
    assert [a for _, a in seen] == [[pytest.approx(cfg.lr * f)] * 2 for f in factors]


def test_muon_run_is_deterministic_and_ctrl_c_resume_exact(tmp_path: Path) -> None:
    cfg = cfg_for(optimizer="muon", muon_lr=0.05, grad_accum=2, checkpoint_every=100, epochs=2)
    ref_model = tiny(dropout=0.3)
    Trainer(ref_model, cfg, tmp_path / "ref", TinyData(), step_fn, make_evaluate()).fit()
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        Trainer(tiny(dropout=0.3), cfg, run, TinyData(), InterruptAt(9), make_evaluate()).fit()
    model = tiny(dropout=0.3)
    Trainer(model, cfg, run, TinyData(), step_fn, make_evaluate()).fit(resume=True)
    assert all(torch.equal(v, ref_model.state_dict()[k]) for k, v in model.state_dict().items())
    assert without_timing(read_metrics(run / "metrics.jsonl")) == without_timing(
        read_metrics(tmp_path / "ref" / "metrics.jsonl")
    )


def test_eval_start_skips_the_early_evaluations(tmp_path: Path) -> None:
    cfg = cfg_for(eval_every=2, eval_start=5, max_steps=9)
    Trainer(tiny(), cfg, tmp_path, TinyData(), step_fn, make_evaluate()).fit()
    vals = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "val"]
    assert vals == [6, 8, 9]  # from step 5 on every 2nd step, and the last


class DepthTagger(TinyTagger):
    """TinyTagger that lists its layers' depths: out 0, hidden 1, embed 2."""

    def layer_depths(self) -> dict[str, int]:
        depth = {"out": 0, "hidden": 1, "embed": 2}
        return {name: depth[name.split(".")[0]] for name, _ in self.named_parameters()}


def test_layer_wise_lr_decay_moves_each_depth_by_its_own_lr(tmp_path: Path) -> None:
    """AdamW's first step moves every element with a gradient by lr (m̂ / √v̂ = ±1 when there
    is no weight decay): with lr_decay 0.5, by lr · 0.5^depth, lr the scheduled rate logged."""
    seed_everything(0)
    model = DepthTagger()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = cfg_for(max_steps=1, lr_decay=0.5, weight_decay=0.0, warmup_steps=0, schedule="constant")
    Trainer(model, cfg, tmp_path, TinyData(), step_fn).fit()
    lr = read_metrics(tmp_path / "metrics.jsonl")[0]["lr"]
    assert lr > 0
    for name, p in model.named_parameters():
        moved = (p.detach() - before[name]).abs()
        moved = moved[moved > 0].median()  # an element with a tiny gradient moves less (eps)
        expected = lr * 0.5 ** model.layer_depths()[name]
        assert math.isclose(float(moved), expected, rel_tol=1e-3), (name, float(moved), expected)
