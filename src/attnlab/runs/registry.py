"""The task registry: every `attnlab train TASK` and every run directory's `task` names one entry.

An entry is a name, a one-line help and the module that implements it; nothing heavy is
imported until a task is used, so `attnlab --help` and `attnlab train --help` stay fast (no
torch). The module defines ``TASK``, an instance of :class:`attnlab.runs.task.Task`.
Adding a task = one module + one line here (docs/extending.md walks through an example).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnlab.errors import UserError

if TYPE_CHECKING:
    from attnlab.runs.task import Task


@dataclass(frozen=True)
class TaskEntry:
    """What the command line needs to know about a task before importing it."""

    name: str
    help: str
    module: str


REGISTRY: dict[str, TaskEntry] = {
    entry.name: entry
    for entry in (
        TaskEntry(
            "classify",
            "text classifier of the bundled Chinese reviews (or your file): fine-tunes the "
            "pretrained multilingual-e5-small by default (--init e5, another BERT checkpoint or "
            "run); --init none trains the tutorial's character-level Transformer from scratch",
            "attnlab.tasks.classify",
        ),
        TaskEntry(
            "distill",
            "a classifier trained on a teacher run's soft labels (knowledge distillation)",
            "attnlab.tasks.distill",
        ),
        TaskEntry(
            "bert_classify",
            "fine-tune a pretrained BERT (multilingual-e5-small by default) as a text classifier",
            "attnlab.tasks.bert_classify",
        ),
        TaskEntry(
            "mlm",
            "masked-LM pretraining, --arch bert (default) | albert | deberta, on any text "
            "(bundled Chinese reviews by default)",
            "attnlab.tasks.bert_mlm",
        ),
        TaskEntry(
            "electra",
            "ELECTRA pretraining (replaced-token detection) of a BERT encoder on any text",
            "attnlab.tasks.electra",
        ),
        TaskEntry(
            "lm",
            "GPT language model (Shakespeare, character level, by default)",
            "attnlab.tasks.lm",
        ),
        TaskEntry(
            "translate",
            "encoder-decoder translation, --arch seq2seq (default) | t5 (Bible en->de by default)",
            "attnlab.tasks.translate",
        ),
        TaskEntry(
            "vision",
            "image classifier, --arch vit (default) | swin | cnn | deit (Fashion-MNIST by default)",
            "attnlab.tasks.vision",
        ),
        TaskEntry(
            "mae",
            "masked-autoencoder pretraining of a ViT encoder on images (Fashion-MNIST)",
            "attnlab.tasks.mae",
        ),
    )
}


def task_names() -> list[str]:
    """Every registered task name, in registry order."""
    return list(REGISTRY)


def get_task(name: str) -> Task:
    """The task called ``name``; a ValueError lists the known ones."""
    if name not in REGISTRY:
        raise UserError(f"unknown task {name!r}; known tasks: {', '.join(REGISTRY)}")
    return importlib.import_module(REGISTRY[name].module).TASK
