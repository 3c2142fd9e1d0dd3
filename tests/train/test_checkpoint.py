"""Checkpoint files: pickle-free round-trips and recovery from a crash at every swap point."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from attnlab.train.checkpoint import (
    load_checkpoint,
    load_weights,
    recover_state_dir,
    save_checkpoint,
    save_weights,
)
from attnlab.train.optim import build_optimizer
from attnlab.train.rng import capture_rng


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.mid = nn.Linear(4, 4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.embed(x))))  # (B, T, 7)


def trained(steps: int = 3) -> tuple[TiedLM, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TiedLM()
    opt = build_optimizer(model, lr=1e-2, weight_decay=0.1, betas=(0.8, 0.9))
    for _ in range(steps):
        model(torch.randint(0, 7, (2, 3))).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def write(run_dir: Path, step: int) -> None:
    model, opt = trained()
    save_checkpoint(run_dir, model, opt, {"step": step}, [capture_rng()])


def test_round_trip_restores_model_optimizer_rng_and_state(tmp_path: Path) -> None:
    model, opt = trained()
    rng = capture_rng()
    save_checkpoint(tmp_path, model, opt, {"step": 3, "best": 0.5, "t": (1, 2)}, [rng, rng])
    files = sorted(p.name for p in (tmp_path / "state").iterdir())
    assert files == [
        "COMPLETE",
        "model.safetensors",
        "optimizer.json",
        "optimizer.safetensors",
        "rng.json",
        "rng.safetensors",
        "trainer.json",
    ]  # no pickle anywhere

    fresh = TiedLM()
    fresh_opt = build_optimizer(fresh, lr=1.0, weight_decay=0.0, betas=(0.5, 0.5))
    state, rngs = load_checkpoint(tmp_path, fresh, fresh_opt)
    assert state == {"step": 3, "best": 0.5, "t": (1, 2)}
    assert fresh.head.weight is fresh.embed.weight  # tying survives loading
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values())
    )
    want, got = opt.state_dict(), fresh_opt.state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert got["param_groups"][0]["betas"] == (0.8, 0.9)
    for pid, pstate in want["state"].items():
        for key, value in pstate.items():
            assert torch.equal(got["state"][pid][key], value), (pid, key)
    assert len(rngs) == 2 and torch.equal(rngs[1]["torch"], rng["torch"])
    assert rngs[0]["python"] == rng["python"] and rngs[0]["numpy"] == rng["numpy"]


def test_save_weights_is_atomic_and_loadable(tmp_path: Path) -> None:
    model, _ = trained()
    path = save_weights(model, tmp_path / "model.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # temp file renamed
    other = TiedLM()
    load_weights(other, path)
    assert torch.equal(other.mid.weight, model.mid.weight)
    assert torch.equal(other.embed.weight, model.embed.weight)


def steps_in(run_dir: Path) -> int:
    return json.loads((run_dir / "state" / "trainer.json").read_text())["step"]


def test_crash_while_writing_tmp_keeps_old_state(tmp_path: Path) -> None:
    write(tmp_path, step=1)
    (tmp_path / "state.tmp").mkdir()
    (tmp_path / "state.tmp" / "model.safetensors").write_bytes(b"half")
    assert recover_state_dir(tmp_path) == tmp_path / "state"
    assert steps_in(tmp_path) == 1 and not (tmp_path / "state.tmp").exists()


@pytest.mark.parametrize("tmp_complete,expected", [(True, 2), (False, 1)])
def test_crash_between_renames(tmp_path: Path, tmp_complete: bool, expected: int) -> None:
    """state -> state.old happened, state.tmp -> state did not."""
    write(tmp_path / "a", step=1)
    write(tmp_path / "b", step=2)
    shutil.move(tmp_path / "a" / "state", tmp_path / "state.old")
    shutil.move(tmp_path / "b" / "state", tmp_path / "state.tmp")
    if not tmp_complete:
        (tmp_path / "state.tmp" / "COMPLETE").unlink()
    assert recover_state_dir(tmp_path) == tmp_path / "state"
    assert steps_in(tmp_path) == expected
    assert not (tmp_path / "state.old").exists() and not (tmp_path / "state.tmp").exists()


def test_crash_before_deleting_old(tmp_path: Path) -> None:
    write(tmp_path, step=2)
    write(tmp_path / "a", step=1)
    shutil.move(tmp_path / "a" / "state", tmp_path / "state.old")
    assert recover_state_dir(tmp_path) == tmp_path / "state" and steps_in(tmp_path) == 2
    assert not (tmp_path / "state.old").exists()
    write(tmp_path, step=3)  # a later save after recovery swaps cleanly
    assert steps_in(tmp_path) == 3


def test_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    model, opt = trained(0)
    assert recover_state_dir(tmp_path) is None
    with pytest.raises(ValueError, match="no complete checkpoint"):
        load_checkpoint(tmp_path, model, opt)
