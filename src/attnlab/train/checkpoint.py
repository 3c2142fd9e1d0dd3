"""Atomic, pickle-free checkpoints: best weights and the resumable `run_dir/state/` directory.

`state/` holds
  model.safetensors                        model weights (shared/tied tensors stored once)
  optimizer.safetensors + optimizer.json   optimizer tensors, and its scalars and param_groups
  rng.safetensors + rng.json               every rank's RNG states (torch tensors / python+numpy)
  trainer.json                             loop progress (step, epoch, batch position, best
                                           metric, early-stop counter, log window, ...), the
                                           GradScaler state, and the world size
  COMPLETE                                 written last; marks the directory as whole
It is written as `state.tmp/`, then swapped in with renames (state -> state.old,
state.tmp -> state, delete state.old). `recover_state_dir` repairs a crash at any point of that.

Files hold CPU tensors, whatever device wrote them, and loading maps every tensor explicitly
to where it belongs (the `map_location` of `torch.load`, for safetensors): weights to the
device of the model they are loaded into, optimizer state to the device of its parameter
(the `step` counters to the CPU, as a fresh non-capturable optimizer keeps them). A run
written on a GPU so loads on a CPU and back, bitwise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.errors import UserError
from attnlab.tensor_files import (
    fsync_file,
    load_tensors_into,
    model_tensors,
    read_tensors,
    write_tensors,
)
from attnlab.train.rng import join_rng, split_rng

STATE, TMP, OLD, COMPLETE = "state", "state.tmp", "state.old", "COMPLETE"


def _write_json(path: Path, obj: Any) -> None:
    """Write `obj` as JSON and fsync it."""
    path.write_text(json.dumps(_tag_tuples(obj)))
    fsync_file(path)


def _read_json(path: Path) -> Any:
    """Read JSON written by `_write_json` (tuples restored); a bad file is a one-line error."""
    try:
        return _untag_tuples(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(
            f"{path}: unreadable checkpoint file ({err}); restore it, or train into a new --out"
        ) from None


def _tag_tuples(obj: Any) -> Any:
    """Encode tuples as {"__tuple__": [...]} so JSON round-trips them (e.g. AdamW betas)."""
    if isinstance(obj, tuple):
        return {"__tuple__": [_tag_tuples(v) for v in obj]}
    if isinstance(obj, list):
        return [_tag_tuples(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _tag_tuples(v) for k, v in obj.items()}
    return obj


def _untag_tuples(obj: Any) -> Any:
    """Inverse of `_tag_tuples`."""
    if isinstance(obj, dict):
        if set(obj) == {"__tuple__"}:
            return tuple(_untag_tuples(v) for v in obj["__tuple__"])
        return {k: _untag_tuples(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_untag_tuples(v) for v in obj]
    return obj


def save_weights(model: nn.Module, path: str | Path) -> Path:
    """Atomically write `model`'s weights as safetensors with a checksum in the file's metadata.

    Tied weights are stored once; like `safetensors.torch.save_model`, the metadata maps each
    dropped name to the name it shares storage with.
    """
    tensors, tied = model_tensors(model)
    return write_tensors(tensors, path, metadata=tied)


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load weights written by `save_weights` into `model` (strict), checking the file first.

    A bad file (truncated, checksum mismatch, NaN/inf) or weights that do not fit the model
    raise a one-line ValueError naming the file and the fix.
    """
    load_tensors_into(model, read_tensors(path, "weights"), path)


def _optimizer_to_files(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer state_dict into tensors and a JSON-able remainder."""
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, pstate in sd["state"].items():
        for key, value in pstate.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(pid), {})[key] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _state_device(opt: torch.optim.Optimizer, pid: int, key: str) -> torch.device:
    """Where a state tensor of parameter number `pid` lives: its parameter's device, except
    `step`, which stays on the CPU unless the group is capturable or fused (torch's rule)."""
    index = 0
    for group in opt.param_groups:
        for param in group["params"]:
            if index == pid:
                if key == "step" and not (group.get("capturable") or group.get("fused")):
                    return torch.device("cpu")
                return param.device
            index += 1
    raise UserError(f"optimizer state names parameter {pid}, but the optimizer has {index}")


def _optimizer_from_files(
    opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict
) -> None:
    """Load the state split by `_optimizer_to_files` into `opt`, each tensor moved to the
    device it belongs on (`_state_device`)."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        pid, _, key = name.partition(".")
        state.setdefault(int(pid), {})[key] = value.to(_state_device(opt, int(pid), key))
    for pid, values in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(values)
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def recover_state_dir(run_dir: str | Path) -> Path | None:
    """Repair a checkpoint swap interrupted by a crash; return `state/` if one exists."""
    run_dir = Path(run_dir)
    state, tmp, old = run_dir / STATE, run_dir / TMP, run_dir / OLD
    if not state.exists():
        if (tmp / COMPLETE).exists():  # crashed after state -> state.old, before tmp -> state
            tmp.rename(state)
        elif (old / COMPLETE).exists():
            old.rename(state)
    for leftover in (tmp, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    return state if (state / COMPLETE).exists() else None


def save_checkpoint(
    run_dir: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    rng_states: list[dict[str, Any]],
) -> Path:
    """Atomically write the resumable `run_dir/state/` (see module docstring); return its path."""
    run_dir = Path(run_dir)
    recover_state_dir(run_dir)
    tmp = run_dir / TMP
    tmp.mkdir(parents=True)
    save_weights(model, tmp / "model.safetensors")
    opt_tensors, opt_meta = _optimizer_to_files(optimizer)
    write_tensors(opt_tensors, tmp / "optimizer.safetensors")
    _write_json(tmp / "optimizer.json", opt_meta)
    rng_tensors: dict[str, torch.Tensor] = {}
    rng_meta = []
    for rank, rng in enumerate(rng_states):
        tensors, meta = split_rng(rng, prefix=f"rank{rank}.")
        rng_tensors |= tensors
        rng_meta.append(meta)
    write_tensors(rng_tensors, tmp / "rng.safetensors")
    _write_json(tmp / "rng.json", rng_meta)
    _write_json(tmp / "trainer.json", trainer_state)
    _write_json(tmp / COMPLETE, {"step": trainer_state.get("step")})
    state = run_dir / STATE
    if state.exists():
        state.rename(run_dir / OLD)
    tmp.rename(state)
    shutil.rmtree(run_dir / OLD, ignore_errors=True)
    return state


def read_trainer_state(run_dir: str | Path) -> dict[str, Any] | None:
    """The saved trainer.json of `run_dir`'s last complete checkpoint, without loading weights."""
    state = recover_state_dir(run_dir)
    return None if state is None else _read_json(state / "trainer.json")


def load_checkpoint(
    run_dir: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Load `run_dir/state/` into `model` and `optimizer`; return (trainer_state, rng_states)."""
    state = recover_state_dir(run_dir)
    if state is None:
        raise UserError(
            f"no complete checkpoint in {Path(run_dir) / STATE}; "
            "start the run anew without --resume"
        )
    load_weights(model, state / "model.safetensors")
    _optimizer_from_files(
        optimizer,
        read_tensors(state / "optimizer.safetensors", "optimizer state"),
        _read_json(state / "optimizer.json"),
    )
    rng_tensors = read_tensors(state / "rng.safetensors", "RNG state")
    rng_states = [
        join_rng(rng_tensors, meta, prefix=f"rank{rank}.")
        for rank, meta in enumerate(_read_json(state / "rng.json"))
    ]
    return read_trainer_state(run_dir), rng_states


def check_checkpoint(run_dir: str | Path) -> Path | None:
    """Read every file of `run_dir/state/` (checksums, truncation, JSON) without loading it
    into anything, so a resume can refuse a damaged checkpoint before it changes a file.
    Returns `state/`, or None when there is no checkpoint to resume from."""
    state = recover_state_dir(run_dir)
    if state is None:
        return None
    read_tensors(state / "model.safetensors", "weights")
    read_tensors(state / "optimizer.safetensors", "optimizer state")
    read_tensors(state / "rng.safetensors", "RNG state")
    for name, keys in _JSON_KEYS.items():
        value = _read_json(state / name)
        if not (isinstance(value, dict) and all(isinstance(value.get(k), t) for k, t in keys)):
            _foreign(state / name)
    ranks = _read_json(state / "trainer.json")["world_size"]
    rng = _read_json(state / "rng.json")
    if not (isinstance(rng, list) and len(rng) == ranks and all(isinstance(r, dict) for r in rng)):
        _foreign(state / "rng.json")  # one object per process of the run
    return state


# The entries the JSON files of a checkpoint must hold (rng.json: a list of per-rank objects).
_JSON_KEYS: dict[str, tuple[tuple[str, type], ...]] = {
    "optimizer.json": (("scalars", dict), ("param_groups", list)),
    "trainer.json": (("loop", dict), ("world_size", int), ("config", dict)),
}


def _foreign(path: Path) -> None:
    raise UserError(
        f"{path}: not a checkpoint file of attnlab (valid JSON of another shape); restore it, "
        "or train into a new --out"
    )
