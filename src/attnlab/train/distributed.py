"""torchrun support: process-group setup from the environment, DDP wrapping, batch sharding.

Launch the same script with `torchrun --nproc_per_node=N script.py`; `init_distributed` reads
RANK/LOCAL_RANK/WORLD_SIZE, uses gloo on CPU and nccl on CUDA, and pins each rank to
cuda:LOCAL_RANK. A plain `python script.py` gets a world of one and no process group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job: rank, world size, device, and who owns the group."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    owns_group: bool  # True when init_distributed created the process group (and must destroy it)

    @property
    def is_main(self) -> bool:
        """Rank 0 writes metrics, checkpoints, the best model and TensorBoard."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether there is more than one process."""
        return self.world_size > 1


def init_distributed(device: str | torch.device) -> DistEnv:
    """Join the torchrun job described by the environment (or a world of one) on `device`."""
    device = torch.device(device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and not dist.is_initialized():
        return DistEnv(0, 0, 1, device, owns_group=False)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistEnv(dist.get_rank(), local_rank, dist.get_world_size(), device, owns_group=owns)


def wrap_ddp(model: nn.Module, env: DistEnv) -> nn.Module:
    """Wrap `model` in DistributedDataParallel when distributed (this broadcasts rank 0's
    weights to all ranks); otherwise return it unchanged."""
    if not env.distributed:
        return model
    ids = [env.device.index] if env.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def shard(indices: list[int], env: DistEnv) -> list[int]:
    """This rank's share of a global batch: indices[rank::world_size]."""
    return indices[env.rank :: env.world_size]


def all_reduce_sum(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum `values` over ranks in place (no-op for a world of one) and return it."""
    if env.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def broadcast_object(obj: Any, env: DistEnv) -> Any:
    """Return rank 0's `obj` on every rank (picklable objects only; transport, not storage)."""
    if not env.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any, env: DistEnv) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def cleanup(env: DistEnv, wait: bool = True) -> None:
    """Destroy the process group if `init_distributed` created it, after a barrier if `wait`
    (skip the barrier when leaving on an error: the other ranks may never reach it)."""
    if env.owns_group and dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper (or `model` itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model
