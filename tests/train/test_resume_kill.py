"""The resume contract, for real: SIGKILL a training process at arbitrary moments, resume it,
and get bitwise the same metrics and weights as a run that was never interrupted (CPU, fp32)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import torch
from _procs import checkpoint_step, curves, finish, launch, wait_for_checkpoint, weights

# 3 epochs x 12 steps, dropout 0.1 (default), eval every 4 steps, checkpoint every 5.
ARGS = ["epochs=3", "eval_every=4", "checkpoint_every=5", "log_every=3"]
SLOW = ["--sleep", "0.03"]  # slows the runs that get killed; results do not depend on it


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_sigkill_then_resume_is_bitwise_identical(tmp_path: Path, optimizer: str) -> None:
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    args = ARGS + [f"optimizer={optimizer}"]
    reference = launch(ref_dir, args)
    victim = launch(run_dir, args + SLOW)

    first = wait_for_checkpoint(run_dir, victim, after_step=0)
    delay = random.uniform(0.0, 0.3)  # the conftest seed makes this replayable
    time.sleep(delay)
    victim.kill()  # SIGKILL: no handler, no cleanup
    assert victim.wait() == -9, "the process must have been killed, not finished"
    assert not (run_dir / "summary.json").exists(), "the run finished before the kill"
    resumable = checkpoint_step(run_dir)
    print(
        f"first checkpoint at step {first}; killed {delay:.3f}s later; resuming from "
        f"step {resumable}"
    )
    assert 0 < resumable < 36
    victim = launch(run_dir, args + ["--resume"])
    finish(victim)
    finish(reference)

    assert curves(run_dir) == curves(ref_dir)
    for name in ("model.safetensors", "state/model.safetensors", "state/optimizer.safetensors"):
        got, want = weights(run_dir / name), weights(ref_dir / name)
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), f"{name}:{key} differs"
    got = json.loads((run_dir / "summary.json").read_text())
    want = json.loads((ref_dir / "summary.json").read_text())
    for key in ("best_metric", "best_step", "steps", "epochs", "final_train_loss", "stop_reason"):
        assert got[key] == want[key], key
    assert got["steps"] == 36
