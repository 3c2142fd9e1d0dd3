"""The generic training engine: config, data contract, loop, schedules, checkpoints, DDP."""

from attnlab.train.checkpoint import load_weights, save_weights
from attnlab.train.config import TrainConfig
from attnlab.train.data import StepOutput, TrainData
from attnlab.train.distributed import unwrap
from attnlab.train.engine import Trainer
from attnlab.train.precision import choose_precision
from attnlab.train.rng import seed_everything
from attnlab.train.schedules import lr_factor

__all__ = [
    "StepOutput",
    "TrainConfig",
    "TrainData",
    "Trainer",
    "choose_precision",
    "load_weights",
    "lr_factor",
    "save_weights",
    "seed_everything",
    "unwrap",
]
