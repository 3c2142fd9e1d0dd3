"""--optimizer muon on the classify preset (which sets lr_decay 0.6) is refused naming the fix,
--lr-decay 1, and where the decay came from; with the fix it is a config that trains."""

from __future__ import annotations

import pytest

from attnlab.errors import UserError
from attnlab.runs.training import build_config


def test_muon_alone_names_lr_decay_1_and_the_preset() -> None:
    with pytest.raises(UserError) as err:
        build_config("classify", None, {"optimizer": "muon"})
    message = str(err.value)
    assert "--lr-decay 1" in message and "lr_decay is 0.6 (the preset's value" in message
    assert "\n" not in message
    cfg = build_config("classify", None, {"optimizer": "muon", "lr_decay": 1.0})
    assert cfg.train.optimizer == "muon" and cfg.train.lr_decay == 1.0
