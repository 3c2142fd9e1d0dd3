"""``attnlab prune RUN --heads N --out OUT``: a classifier run with N attention heads removed.

Head importance (Michel et al. 2019, :mod:`attnlab.compress.heads`) is measured on the run's
validation split with the training loss (cross-entropy); the N least important heads are cut
out of the weights (smaller projections), and OUT is a complete run folder: the source run's
files, its config with ``model.heads_per_layer`` set, the smaller weights, and ``prune.json``
(importance, removed heads, validation accuracy and loss before and after, parameter counts).
Every verb that takes the source run takes OUT. Works for every ``classify`` run (one model, not
an ensemble; no per-head position bias).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.compress.heads import head_importance, heads_to_remove, prune_heads
from attnlab.errors import UserError
from attnlab.infer.classifier import ClassifierRun
from attnlab.runs import folder
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.load import load_run
from attnlab.train.checkpoint import save_weights

# Files of the source run that are not copied: its weights, training state, lock and results
# (prune.json holds the pruned model's).
_SKIP = {WEIGHTS, "state", folder.LOCK, "results.json", "test_report.txt"}


def validation_data(run: Any) -> Any:
    """The run's validation split as a ClassificationData (batches of ids, lengths, labels),
    read as the run reads a text."""
    texts, labels, _ = run.split_texts("val")
    return run.dataset(texts, labels)


def batches(data: Any) -> list[dict[str, torch.Tensor]]:
    return [data.collate(indices) for indices in data.batches(0)]


def loss_fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The summed cross-entropy of a batch (importance sums over examples, as eq. 2)."""
    logits = model(batch["input_ids"], batch["lengths"])
    return F.cross_entropy(logits, batch["labels"], reduction="sum")


@torch.no_grad()
def accuracy(model: torch.nn.Module, data: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Validation accuracy and mean cross-entropy."""
    right = n = 0
    loss = 0.0
    for batch in data:
        logits = model(batch["input_ids"], batch["lengths"])
        right += int((logits.argmax(-1) == batch["labels"]).sum())
        loss += float(F.cross_entropy(logits, batch["labels"], reduction="sum"))
        n += len(batch["labels"])
    return {"accuracy": right / max(n, 1), "loss": loss / max(n, 1)}


def prunable_model(run: Any) -> torch.nn.Module:
    """The run's model, refused (UserError) where heads cannot be pruned one by one."""
    if not isinstance(run, ClassifierRun):
        raise UserError(f"{run.run_dir} holds a {run.task!r} run; prune takes classifier runs")
    if run.members > 1:
        raise UserError("prune takes a single classifier, not an ensemble (members > 1)")
    pos = getattr(run.config.model, "pos", None)
    if pos in ("t5", "alibi"):
        raise UserError(f"pos={pos!r} biases each head's scores; prune needs other positions")
    return run.model


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    attention = sum(
        p.numel() for n, p in model.named_parameters() if ".self_attn." in n or ".attn." in n
    )
    return {"total": sum(p.numel() for p in model.parameters()), "attention": attention}


def prune_run(source: str | Path, n_heads: int, out: str | Path) -> dict[str, Any]:
    """Prune ``n_heads`` heads of the run in ``source`` into a new run folder ``out``."""
    out = Path(out)
    if out.exists():
        raise UserError(f"{out} exists; prune writes a new run folder, give another --out")
    folder.check_not_quantized(Path(source), "prune")
    folder.check_derived_out(Path(source), out, "prune")
    run = load_run(source)
    model = prunable_model(run).float().eval()
    data = batches(validation_data(run))
    before, size_before = accuracy(model, data), count_parameters(model)
    importance = head_importance(model, data, loss_fn)
    try:
        remove = heads_to_remove(importance, n_heads)
    except ValueError as err:
        raise UserError(f"--heads {n_heads}: {err}") from None
    kept = prune_heads(model, remove)
    after = accuracy(model, data)
    raw = folder.read_config(run.run_dir)
    raw["model"]["heads_per_layer"] = list(kept)
    report = {
        "source": str(run.run_dir),
        "heads_removed": n_heads,
        "removed": remove,
        "heads_per_layer": kept,
        "importance": [
            [round(float(v), 6) for v in row if torch.isfinite(v)] for row in importance
        ],
        "val_before": before,
        "val_after": after,
        "parameters_before": size_before,
        "parameters_after": count_parameters(model),
    }
    with folder.derived_copy(run.run_dir, out, _SKIP) as staging:
        folder.write_config(staging, raw)
        save_weights(model, staging / WEIGHTS)
        (staging / folder.PRUNED).write_text(json.dumps(report, indent=2) + "\n")
    return report
