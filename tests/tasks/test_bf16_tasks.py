"""Swin, MAE, T5, ALBERT, DeBERTa, ELECTRA and the LM's flash, T5-bias, DyT and NoPE options train
under bf16 autocast, the precision `precision auto` picks on CPUs with bf16 units and on GPUs
(bf16 autocast runs on any CPU, slowly without those units)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from attnlab.cli import main

# Small encoders: bf16 is emulated (slow) on CPUs without bf16 units, and at the default sizes
# two steps and validation took minutes there (DeBERTa's default has 184M parameters).
ZOO_TINY = ["--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--d-ff", "64",
            "--embedding-size", "16", "--vocab-size", "120", "--max-len", "24"]  # fmt: skip
ELECTRA_TINY = ["--d-model", "32", "--n-layers", "2", "--n-heads", "4", "--d-ff", "64",
                "--vocab-size", "200", "--max-len", "24"]  # fmt: skip
COMMANDS = {
    "swin": ["train", "vision", "--arch", "swin", "--max-train", "64", "--max-steps", "2"],
    "mae": ["train", "mae", "--max-train", "64", "--max-steps", "2"],
    "t5 translate": ["train", "translate", "--config", "copy", "--arch", "t5", "--max-steps", "2"],
    "albert mlm": ["train", "mlm", "--arch", "albert", "--max-steps", "2", *ZOO_TINY],
    "deberta mlm": ["train", "mlm", "--arch", "deberta", "--max-steps", "2", *ZOO_TINY],
    "electra": ["train", "mlm", "--objective", "electra", "--max-steps", "2", *ELECTRA_TINY],
    "lm flash t5-bias": ["train", "lm", "--backend", "flash", "--pos", "t5", "--max-steps", "2"],
    "lm dyt nope": ["train", "lm", "--norm", "dyt", "--pos", "none", "--max-steps", "2"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_trains_under_bf16_autocast(name: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main([*COMMANDS[name], "--precision", "bf16", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["train"]["precision"] == "bf16"
    losses = [
        json.loads(line)["loss"]
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line
    ]
    assert losses and all(math.isfinite(v) for v in losses)
