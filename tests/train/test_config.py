"""TrainConfig rejects bad values with one line naming the config, field and bound
(declared with ``configs.setting`` and checked by ``ConfigBase``)."""

from __future__ import annotations

import pytest

from attnlab.train import TrainConfig


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"optimizer": "sgd"}, "optimizer must be one of adamw, muon"),
        ({"muon_lr": 0.0}, "muon_lr must be > 0"),
        ({"muon_momentum": 1.0}, "TrainConfig.muon_momentum must be < 1, got 1.0"),
        ({"muon_ns_steps": 0}, "TrainConfig.muon_ns_steps must be >= 1"),
        ({"muon_weight_decay": -0.1}, "muon_weight_decay must be >= 0"),
        ({"muon_ns_dtype": "float16"}, "muon_ns_dtype must be one of float32, bfloat16"),
        ({"schedule": "step"}, "schedule must be one of"),
        ({"decay_ratio": 1.5}, "TrainConfig.decay_ratio must be <= 1, got 1.5"),
        ({"target_loss": -1.0}, "target_loss must be >= 0"),
    ],
)
def test_bad_values_name_the_field(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kw)


def test_defaults_keep_adamw_and_no_target() -> None:
    cfg = TrainConfig()
    assert cfg.optimizer == "adamw" and cfg.target_loss == 0.0 and cfg.schedule == "cosine"
