"""Loading what `attnlab explore` looks inside: every run kind through one function.

All run loading of the explorer goes through :func:`load_source`, so that switching it to the
task registry's ``load_run`` later touches this file only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["classifier", "bert", "gpt", "translate", "vit", "cnn"]
KINDS: tuple[str, ...] = ("classifier", "bert", "gpt", "translate", "vit", "cnn")


@dataclass
class Source:
    """A loaded run: its kind, the task's run object and a name to show."""

    kind: Kind
    run: Any
    name: str


def load_source(run: str | Path) -> Source:
    """A run directory (classify, BERT fine-tune, lm, translate, vit, cnn), a Hugging Face GPT-2
    directory, a BERT checkpoint directory, or ``"minilm"`` (the shipped all-MiniLM-L6-v2)."""
    name = str(run)
    if name == "minilm":
        from attnlab.tasks.bert import SentenceEncoder

        return Source("bert", SentenceEncoder.load("minilm"), "all-MiniLM-L6-v2")
    path = Path(run)
    config = path / "config.json"
    if not config.is_file():
        raise ValueError(
            f"{path} is not a run directory (no config.json); give a run of `attnlab train ...`, "
            "a BERT or GPT-2 checkpoint directory, or minilm"
        )
    raw = json.loads(config.read_text(encoding="utf-8"))
    task = raw.get("task")
    if task == "classify":
        from attnlab.tasks.classify import ClassifierRun

        return Source("classifier", ClassifierRun.load(path), path.name)
    if task == "bert_classify":
        from attnlab.tasks.bert_classify import BertClassifierRun

        return Source("bert", BertClassifierRun.load(path), path.name)
    if task == "lm" or raw.get("model_type") == "gpt2":
        from attnlab.tasks.lm import LMRun

        return Source("gpt", LMRun.load(path), path.name)
    if task == "translate":
        from attnlab.tasks.translate import TranslatorRun

        return Source("translate", TranslatorRun.load(path), path.name)
    if task == "vision":
        from attnlab.tasks.vision import VisionRun

        vision = VisionRun.load(path)
        return Source("vit" if vision.config.arch == "vit" else "cnn", vision, path.name)
    if raw.get("model_type") == "bert" or (path / "checkpoint" / "config.json").is_file():
        from attnlab.tasks.bert import SentenceEncoder

        return Source("bert", SentenceEncoder.load(path), path.name)
    raise ValueError(
        f"{path} holds a {task or raw.get('model_type')!r} run, which has no attention to "
        f"explore; the explorer reads classify, bert_classify, lm, translate and vision runs"
    )
