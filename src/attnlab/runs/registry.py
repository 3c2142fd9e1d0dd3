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
            "pretrained multilingual-e5-small (--arch e5, the default; or minilm, a checkpoint "
            "folder, an `attnlab train mlm` run); --arch char trains the tutorial's "
            "character-level Transformer from scratch. On your own file the run reads it "
            "first and prints its plan: the values of extra_train, turns, clean_labels, epochs "
            "and monitor you do not give follow the data (docs/classify.md#your-own-data)",
            "attnlab.tasks.classify",
        ),
        TaskEntry(
            "mlm",
            "pretraining of an encoder on any text (bundled Chinese reviews by default): masked "
            "LM of a new --arch bert (default) | albert | deberta, or continuing a pretrained "
            "one (--arch minilm | FOLDER); --objective electra for replaced-token detection",
            "attnlab.tasks.bert_mlm",
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


# Tasks of earlier attnlab versions, and what trains such a run now.
RETIRED = {
    "bert_classify": "`attnlab train classify --arch e5` (or --arch FOLDER)",
    "distill": "`attnlab train classify --arch char --teacher RUN`",
    "electra": "`attnlab train mlm --objective electra`",
}


def get_task(name: str) -> Task:
    """The task called ``name``; a UserError lists the known ones."""
    if name in RETIRED:
        raise UserError(
            f"the task {name!r} belongs to an earlier attnlab; such runs are now trained with "
            f"{RETIRED[name]}: train it again"
        )
    if name not in REGISTRY:
        raise UserError(f"unknown task {name!r}; known tasks: {', '.join(REGISTRY)}")
    return importlib.import_module(REGISTRY[name].module).TASK
