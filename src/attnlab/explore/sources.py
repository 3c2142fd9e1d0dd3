"""Loading what `attnlab explore` looks inside: every run kind through one function.

All run loading of the explorer goes through :func:`load_source`: the task registry's
``load_run`` for run directories (each ``Run`` names the page that draws it,
``Run.explore_page``), plus the checkpoints that are not runs (``minilm``, a BERT checkpoint
directory, a Hugging Face GPT-2 directory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from attnlab.errors import UserError

Kind = Literal["classifier", "bert", "gpt", "translate", "vit", "cnn"]  # the pages it draws


@dataclass
class Source:
    """A loaded run: its kind, the task's run object and a name to show."""

    kind: Kind
    run: Any
    name: str


def load_source(run: str | Path) -> Source:
    """A run directory (classify, mlm, lm, translate, vision), a Hugging Face GPT-2 directory, a
    BERT / XLM-R checkpoint directory, or a registered pretrained encoder (e5, minilm)."""
    from attnlab.infer.embeddings import SentenceEncoder
    from attnlab.runs.encoders import is_encoder_name

    if is_encoder_name(run):
        return Source("bert", SentenceEncoder.load(run), str(run))
    path = Path(run)
    config = path / "config.json"
    if not config.is_file():
        raise UserError(
            f"{path} is not a run directory (no config.json); give a run of `attnlab train ...`, "
            "a BERT or GPT-2 checkpoint directory, e5 or minilm"
        )
    raw = json.loads(config.read_text(encoding="utf-8"))
    if raw.get("model_type") == "gpt2":
        from attnlab.infer.lm import LMRun

        return Source("gpt", LMRun.load(path), path.name)
    if "task" not in raw or (path / "checkpoint" / "config.json").is_file():  # an encoder
        return Source("bert", SentenceEncoder.load(path), path.name)
    from attnlab.runs.load import load_run

    loaded = load_run(path)
    if loaded.explore_page is None:  # the Run says which page draws it (tasks.task.Run)
        raise UserError(f"{path} holds a {loaded.task!r} run, which has no attention to explore")
    return Source(loaded.explore_page, loaded, path.name)
