"""What the explorer says about a pretrained encoder's run: the model's name and its prompt.

A fine-tuned run records where its encoder came from in ``data_report.json`` (``encoder``:
``name``, ``model`` "intfloat/multilingual-e5-small (MIT), ..."); the name shown is read there,
never assumed. An encoder trained with a role prefix (e5's ``query: ``) reads every text after
it; :func:`prefix_note` says so in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def recorded_encoder(run: Any) -> dict[str, Any]:
    """The ``encoder`` entry of the run's data_report.json, or {} (older runs, checkpoints)."""
    run_dir = getattr(run, "run_dir", None)
    path = Path(run_dir) / "data_report.json" if run_dir is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        entry = json.loads(path.read_text(encoding="utf-8")).get("encoder")
    except (OSError, ValueError, AttributeError):
        return {}
    return entry if isinstance(entry, dict) else {}


def encoder_name(run: Any, fallback: str) -> str:
    """The encoder's model name: the repository name in the recorded ``model`` entry
    ("intfloat/multilingual-e5-small (MIT), ..." -> "multilingual-e5-small"), else the recorded
    registry name, else the run's ``--arch`` (a folder's last part), else ``fallback``."""
    entry = recorded_encoder(run)
    model = str(entry.get("model") or "")
    if model:
        return model.split(" (")[0].split(",")[0].strip().rsplit("/", 1)[-1]
    if entry.get("name"):
        return str(entry["name"])
    arch = str(getattr(getattr(run, "config", None), "arch", "") or "")
    return Path(arch).name if arch else fallback


def prefix_note(name: str, prefix: str) -> str:
    """One line on the prompt prefix the model reads before every text."""
    return (
        f'{name} reads every text as "{prefix}" + the text: it was trained to mark each input '
        f'with a role word ("query: " for texts to classify or compare), and the run keeps it. '
        "Those pieces, like <s> and </s>, are the same in every input: shown apart, not scored."
    )
