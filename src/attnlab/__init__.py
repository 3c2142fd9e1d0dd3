"""attnlab: Transformers written by hand in PyTorch, each piece proven against a reference.

``attnlab.load(RUN)`` opens a trained run folder for use from Python (attnlab.api); importing
attnlab itself loads no torch, so ``import attnlab`` stays quick until a run is loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from attnlab.api import LoadedRun

__version__ = "0.1.0"


def load(
    run: str | Path, device: str = "cpu", threads: int | str = 1, batch_size: int = 64,
    precision: str = "fp32", compile: bool = False,
) -> LoadedRun:  # fmt: skip
    """The run in folder ``run`` (written by ``attnlab train``), ready for its verbs.

    ``clf = attnlab.load("runs/classify"); clf.predict(["很好看", "剧情拖沓"])`` returns one
    dict per text (``label``, ``probs``, ...), the numbers ``attnlab predict --json`` prints.
    ``threads``: intra-op threads of every call (1; 0 keeps torch's setting, one per core;
    "auto" measures 1 against every usable core); ``precision``: predict's path, "fp32",
    "int8", "bf16" or "auto" (the fastest that keeps fp32's labels on a check set, measured at
    load; ``.inference_path`` says which and why); ``compile``: run that path through
    ``torch.compile`` (fp32 or bf16; compiled at load, which takes tens of seconds, and needs a
    C++ compiler); ``batch_size``: texts per forward pass. Other runs' verbs: ``generate`` (lm),
    ``translate``, ``embed`` (mlm), ``evaluate``, ``attention``; ``.verbs`` lists a run's."""
    from attnlab.api import LoadedRun

    return LoadedRun.open(run, device, threads, batch_size, precision, compile)
