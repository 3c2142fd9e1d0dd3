"""Checkpoint files: pickle-free round-trips and recovery from a crash at every swap point."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_model
from torch import nn

from attnlab.tensor_files import CHECKSUM_KEY, all_finite, tensors_sha256
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


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_weights_file_gets_the_mode_of_any_new_file(tmp_path: Path, umask: int) -> None:
    """safetensors creates its files 0600; a run's weights are readable as its other files are
    (a server run as another user loads them)."""
    import os

    old = os.umask(umask)
    try:
        path = save_weights(nn.Linear(3, 2), tmp_path / "model.safetensors")
        (tmp_path / "other.json").write_text("{}")
    finally:
        os.umask(old)
    mode = path.stat().st_mode & 0o777
    assert mode == 0o666 & ~umask == (tmp_path / "other.json").stat().st_mode & 0o777


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


# --- weights files check themselves: checksum in the file's metadata, one-line errors ---------


def saved(tmp_path: Path) -> tuple[TiedLM, Path]:
    model, _ = trained()
    return model, save_weights(model, tmp_path / "model.safetensors")


def one_line_error(path: Path, match: str, model: nn.Module | None = None) -> str:
    with pytest.raises(ValueError, match=match) as info:
        load_weights(model if model is not None else TiedLM(), path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_overwritten_tensor_bytes_are_a_checksum_error(tmp_path: Path) -> None:
    _, path = saved(tmp_path)
    size = path.stat().st_size
    with open(path, "r+b") as f:  # the tensor data sits at the end of the file
        f.seek(size - 8)
        f.write(bytes([0x3C, 0, 0, 0x3C, 0, 0, 0, 0x3C]))  # still finite float32 values
    assert path.stat().st_size == size
    assert "retrain or restore" in one_line_error(path, "corrupt")


def test_truncated_weights_are_a_one_line_error(tmp_path: Path) -> None:
    _, path = saved(tmp_path)
    path.write_bytes(path.read_bytes()[:-20])
    one_line_error(path, "truncated or not a safetensors file")
    path.write_bytes(b"not safetensors at all")
    one_line_error(path, "truncated or not a safetensors file")


def test_non_finite_weights_are_refused(tmp_path: Path) -> None:
    model, _ = trained()
    with torch.no_grad():
        model.mid.weight[1, 2] = float("nan")
    path = save_weights(model, tmp_path / "model.safetensors")
    assert "'mid.weight'" in one_line_error(path, "non-finite")
    with torch.no_grad():
        model.mid.weight[1, 2] = float("inf")
    one_line_error(save_weights(model, path), "non-finite")


def test_all_finite_is_exact_where_the_fast_sum_overflows() -> None:
    big = torch.full((4,), 3e38)  # finite, but their float32 sum is inf
    assert all_finite(big) and all_finite(big.bfloat16()) and all_finite(torch.zeros(0))
    for bad in (float("nan"), float("inf"), float("-inf")):
        x = big.clone()
        x[2] = bad
        assert not all_finite(x), bad
    assert not all_finite(torch.tensor([float("inf"), float("-inf")]))  # the sum is NaN


def test_file_without_checksum_from_older_runs_still_loads(tmp_path: Path) -> None:
    model, _ = trained()
    path = tmp_path / "old.safetensors"
    save_model(model, str(path))  # what save_weights wrote before checksums
    with safe_open(str(path), framework="pt") as f:
        assert CHECKSUM_KEY not in (f.metadata() or {})
    other = TiedLM()
    load_weights(other, path)
    assert torch.equal(other.mid.weight, model.mid.weight)
    assert other.head.weight is other.embed.weight


def test_tied_weights_round_trip_with_checksum_and_duplicate_names(tmp_path: Path) -> None:
    model, path = saved(tmp_path)
    with safe_open(str(path), framework="pt") as f:
        stored, metadata = set(f.keys()), f.metadata()
    assert stored == {"embed.weight", "mid.weight", "mid.bias"}  # the tied head stored once
    assert metadata["head.weight"] == "embed.weight"  # save_model's duplicate-name record
    assert metadata[CHECKSUM_KEY] == tensors_sha256(load_file(str(path)))
    other = TiedLM()
    load_weights(other, path)
    assert other.head.weight is other.embed.weight
    assert torch.equal(other.head.weight, model.embed.weight)


def test_weights_of_another_shape_are_a_one_line_error(tmp_path: Path) -> None:
    class Wider(TiedLM):
        def __init__(self) -> None:
            super().__init__()
            self.mid = nn.Linear(4, 5)

    _, path = saved(tmp_path)
    assert "mid.weight (4, 4) in the file vs (5, 4)" in one_line_error(path, "do not fit", Wider())


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.safetensors", "rng.safetensors"])
def test_truncated_state_file_on_resume_is_a_one_line_error(tmp_path: Path, name: str) -> None:
    write(tmp_path, step=2)
    target = tmp_path / "state" / name
    target.write_bytes(target.read_bytes()[:-3])
    model, opt = trained(0)
    with pytest.raises(ValueError, match="truncated or not a safetensors file") as info:
        load_checkpoint(tmp_path, model, opt)
    assert "\n" not in str(info.value) and str(target) in str(info.value)


def test_corrupt_optimizer_state_is_a_checksum_error(tmp_path: Path) -> None:
    write(tmp_path, step=2)
    target = tmp_path / "state" / "optimizer.safetensors"
    raw = bytearray(target.read_bytes())
    raw[-1] ^= 0x01  # flip the lowest exponent bit of the last float (still finite)
    target.write_bytes(bytes(raw))
    model, opt = trained(0)
    with pytest.raises(ValueError, match="corrupt"):
        load_checkpoint(tmp_path, model, opt)


def test_broken_state_json_names_the_file(tmp_path: Path) -> None:
    write(tmp_path, step=2)
    (tmp_path / "state" / "optimizer.json").write_text('{"param_groups": [')
    model, opt = trained(0)
    with pytest.raises(ValueError, match="optimizer.json: unreadable checkpoint file"):
        load_checkpoint(tmp_path, model, opt)


def test_checksum_covers_names_dtypes_and_shapes() -> None:
    x = torch.arange(6, dtype=torch.float32)
    base = tensors_sha256({"a": x})
    assert tensors_sha256({"b": x}) != base
    assert tensors_sha256({"a": x.view(2, 3)}) != base
    assert tensors_sha256({"a": x.view(torch.int32)}) != base
    assert tensors_sha256({"a": x.clone()}) == base


# --------------------------------------------------------------------------- devices


def _state_tensors(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    return {
        f"{pid}.{key}": value
        for pid, pstate in opt.state_dict()["state"].items()
        for key, value in pstate.items()
        if isinstance(value, torch.Tensor)
    }


def _trained_on(device: torch.device, steps: int = 3) -> tuple[TiedLM, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TiedLM().to(device)
    opt = build_optimizer(model, lr=1e-2, weight_decay=0.1, betas=(0.8, 0.9))
    for _ in range(steps):
        model(torch.randint(0, 7, (2, 3), device=device)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _fresh_on(device: torch.device) -> tuple[TiedLM, torch.optim.Optimizer]:
    model = TiedLM().to(device)
    return model, build_optimizer(model, lr=1.0, weight_decay=0.0, betas=(0.5, 0.5))


def test_checkpoint_moves_between_devices_bitwise(tmp_path: Path, device: torch.device) -> None:
    """Written on the device under test (a GPU with ATTNLAB_TEST_DEVICE=cuda), loaded on the
    CPU, written again there and loaded back on the device: every weight and optimizer tensor
    is bitwise the original, each on the device it belongs on, and training goes on exactly."""
    model, opt = _trained_on(device)
    save_checkpoint(tmp_path / "dev", model, opt, {"step": 3}, [capture_rng()])

    cpu_model, cpu_opt = _fresh_on(torch.device("cpu"))
    load_checkpoint(tmp_path / "dev", cpu_model, cpu_opt)
    for name, value in model.state_dict().items():
        assert cpu_model.state_dict()[name].device.type == "cpu"
        assert torch.equal(cpu_model.state_dict()[name], value.cpu()), name
    want = _state_tensors(opt)
    got = _state_tensors(cpu_opt)
    assert set(got) == set(want)
    for name, value in got.items():
        assert value.device.type == "cpu" and torch.equal(value, want[name].cpu()), name

    save_checkpoint(tmp_path / "cpu", cpu_model, cpu_opt, {"step": 3}, [capture_rng()])
    back, back_opt = _fresh_on(device)
    load_checkpoint(tmp_path / "cpu", back, back_opt)
    assert back.head.weight is back.embed.weight  # tying survives both moves
    for name, value in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name
    for name, value in _state_tensors(back_opt).items():
        key = name.partition(".")[2]
        assert value.device == (torch.device("cpu") if key == "step" else want[name].device), name
        assert torch.equal(value, want[name]), name

    ids = torch.randint(0, 7, (2, 3), device=device)
    for m, o in ((model, opt), (back, back_opt)):  # one more step each: the same numbers
        m(ids).square().mean().backward()
        o.step()
    for name, value in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name


def test_loading_maps_every_tensor_to_its_device_explicitly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tensor file goes through the checked reader, which opens it on the CPU explicitly
    (safe_open(device="cpu")); a state tensor then goes where torch keeps it: with its
    parameter, `step` on the CPU unless capturable/fused."""
    from attnlab.train import checkpoint as ckpt

    model, opt = trained()
    save_checkpoint(tmp_path, model, opt, {"step": 3}, [capture_rng()])
    seen: list[str] = []
    real_read = ckpt.read_tensors

    def spy(path, what="weights"):
        seen.append(Path(path).name)
        return real_read(path, what)

    monkeypatch.setattr(ckpt, "read_tensors", spy)
    fresh, fresh_opt = _fresh_on(torch.device("cpu"))
    load_checkpoint(tmp_path, fresh, fresh_opt)
    assert seen == ["model.safetensors", "optimizer.safetensors", "rng.safetensors"]
    meta = torch.device("meta")  # stands for "another device" in the placement rule alone
    group = fresh_opt.param_groups[0]
    group["params"] = [p.to(meta) for p in group["params"]]
    assert ckpt._state_device(fresh_opt, 0, "exp_avg") == meta
    assert group["fused"]  # the engine's AdamW is torch's fused one on the CPU
    assert ckpt._state_device(fresh_opt, 0, "step") == meta
    group["fused"] = False
    assert ckpt._state_device(fresh_opt, 0, "step") == torch.device("cpu")
    group["capturable"] = True
    assert ckpt._state_device(fresh_opt, 0, "step") == meta
    with pytest.raises(ValueError, match="names parameter 99"):
        ckpt._state_device(fresh_opt, 99, "step")
