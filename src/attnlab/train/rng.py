"""Seeding and capture/restore of every RNG the loop touches (python, numpy, torch CPU/CUDA)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python `random`, numpy and torch (CPU and all CUDA devices) with `seed`."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng() -> dict[str, Any]:
    """Snapshot all RNG states: {"python", "numpy"} are JSON-able, {"torch", "cuda"} tensors."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Restore RNG states captured by `capture_rng` (CUDA only if both sides have devices)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def split_rng(state: dict[str, Any], prefix: str) -> tuple[dict[str, torch.Tensor], dict]:
    """Split a captured RNG state into (tensors keyed under `prefix`, JSON-able rest)."""
    tensors = {f"{prefix}torch": state["torch"].clone()}  # clones: safetensors refuses aliases
    tensors |= {f"{prefix}cuda.{i}": t.clone() for i, t in enumerate(state["cuda"])}
    meta = {"python": state["python"], "numpy": state["numpy"], "n_cuda": len(state["cuda"])}
    return tensors, meta


def join_rng(tensors: dict[str, torch.Tensor], meta: dict, prefix: str) -> dict[str, Any]:
    """Inverse of `split_rng`."""
    return {
        "python": meta["python"],
        "numpy": meta["numpy"],
        "torch": tensors[f"{prefix}torch"],
        "cuda": [tensors[f"{prefix}cuda.{i}"] for i in range(meta["n_cuda"])],
    }
