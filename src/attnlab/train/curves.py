"""Plot training curves (train loss, val loss, val metrics vs step) from a metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnlab.train.metrics_log import read_metrics

_NOT_CURVES = {"step", "epoch", "split", "precision", "elapsed_s", "best"}


def plot_curves(metrics_jsonl_path: str | Path, out_png: str | Path) -> Path:
    """Write a PNG with a loss panel (train + val) and one panel per other val metric.

    A train metric `x` is drawn on the panel of val metric `val_x` when both exist.
    Uses the Agg canvas directly, so no global matplotlib backend is changed.
    """
    records = read_metrics(metrics_jsonl_path)
    train = [r for r in records if r.get("split") == "train" and "loss" in r]
    val = [r for r in records if r.get("split") == "val"]
    if not train and not val:
        raise ValueError(f"{metrics_jsonl_path} has no train or val records to plot")
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

    fig = Figure(figsize=(5 * (1 + len(other_keys)), 4), tight_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 1 + len(other_keys), squeeze=False)[0]

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
    for ax in axes:
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=100)
    return out_png
