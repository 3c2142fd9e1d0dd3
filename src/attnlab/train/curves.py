"""Plot training curves (train loss, val loss, val metrics, MoE expert usage vs step) from a
metrics.jsonl."""

from __future__ import annotations

import re
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnlab.errors import UserError
from attnlab.train.metrics_log import read_metrics

_NOT_CURVES = {"step", "epoch", "split", "precision", "elapsed_s", "best"}
_USAGE_KEY = re.compile(r"moe(\d+)_(e\d+|dropped)")  # written by attnlab.tasks.lm.moe_metrics


def expert_usage(records: list[dict]) -> dict[int, dict[str, list[tuple[int, float]]]]:
    """Train records' MoE usage as curves: {layer: {"e0": [(step, share of assignments)], ...,
    "dropped": [(step, share dropped)]}}, layers and experts in numeric order; {} without MoE."""
    usage: dict[int, dict[str, list[tuple[int, float]]]] = {}
    for r in records:
        if r.get("split") != "train":
            continue
        for key, value in r.items():
            match = _USAGE_KEY.fullmatch(key)
            if match and isinstance(value, int | float):
                layer = usage.setdefault(int(match[1]), {})
                layer.setdefault(match[2], []).append((r["step"], float(value)))

    def order(name: str) -> tuple[int, int]:
        return (1, 0) if name == "dropped" else (0, int(name[1:]))

    return {i: {k: usage[i][k] for k in sorted(usage[i], key=order)} for i in sorted(usage)}


def plot_curves(metrics_jsonl_path: str | Path, out_png: str | Path) -> Path:
    """Write a PNG with a loss panel (train + val) and one panel per other val metric; below
    them, for a mixture-of-experts model, one panel per MoE layer with each expert's share of
    the top-k token assignments (and the share dropped over capacity, when any was).

    A train metric `x` is drawn on the panel of val metric `val_x` when both exist.
    Uses the Agg canvas directly, so no global matplotlib backend is changed.
    """
    records = read_metrics(metrics_jsonl_path)
    train = [r for r in records if r.get("split") == "train" and "loss" in r]
    val = [r for r in records if r.get("split") == "val"]
    if not train and not val:
        raise UserError(f"{metrics_jsonl_path} has no train or val records to plot")
    val_keys = sorted(
        {
            k
            for r in val
            for k, v in r.items()
            if k not in _NOT_CURVES and isinstance(v, int | float)
        }
    )
    loss_keys = [k for k in val_keys if "loss" in k]
    other_keys = [k for k in val_keys if "loss" not in k]

    usage = expert_usage(records)
    cols = max(1 + len(other_keys), len(usage))
    rows = 2 if usage else 1
    fig = Figure(figsize=(5 * cols, 4 * rows), tight_layout=True)
    FigureCanvasAgg(fig)
    grid = fig.subplots(rows, cols, squeeze=False)
    axes = list(grid[0][: 1 + len(other_keys)])
    usage_axes = list(grid[1][: len(usage)]) if usage else []
    for ax in [*grid[0][1 + len(other_keys) :], *(grid[1][len(usage) :] if usage else [])]:
        ax.set_visible(False)

    def draw(ax, rows: list[dict], key: str, label: str, marker: str = "") -> None:
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
        if pts:
            ax.plot(*zip(*pts), marker=marker, label=label)

    draw(axes[0], train, "loss", "train loss")
    for key in loss_keys:
        draw(axes[0], val, key, key, marker="o")
    axes[0].set_title("loss")
    for ax, key in zip(axes[1:], other_keys):
        train_key = key.removeprefix("val_")
        if train_key != key:
            draw(ax, train, train_key, f"train {train_key}")
        draw(ax, val, key, key, marker="o")
        ax.set_title(key)
    for ax, (layer, curves) in zip(usage_axes, usage.items()):
        for name, pts in curves.items():
            if name != "dropped" or any(share > 0 for _, share in pts):
                ax.plot(*zip(*pts), linestyle="--" if name == "dropped" else "-", label=name)
        ax.set_title(f"MoE layer {layer}: share of top-k assignments per expert")
        ax.set_ylim(bottom=0)
    for ax in axes + usage_axes:
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(**({"fontsize": "x-small", "ncol": 3} if ax in usage_axes else {}))
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=100)
    return out_png
