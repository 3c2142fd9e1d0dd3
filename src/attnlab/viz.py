"""Attention heatmaps: every layer × head with the tokens on both axes, plus token importance."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib

from attnlab.errors import UserError

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from torch import Tensor  # noqa: E402

# Fonts that cover CJK, in order of preference; the set-up installs WenQuanYi Micro Hei.
_CJK_FONT_FILES = (
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/arphic/uming.ttc",
)
_CJK_FONT_NAMES = ("WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Noto Sans CJK SC", "AR PL UMing CN")


def cjk_font() -> font_manager.FontProperties | None:
    """A font that draws Chinese characters, or None (with a warning saying how to get one)."""
    for path in _CJK_FONT_FILES:
        if Path(path).exists():
            return font_manager.FontProperties(fname=path)
    installed = {f.name: f.fname for f in font_manager.fontManager.ttflist}
    for name in _CJK_FONT_NAMES:
        if name in installed:
            return font_manager.FontProperties(fname=installed[name])
    return None


def _needs_cjk(tokens: list[str]) -> bool:
    return any(ord(ch) > 0x2E80 for tok in tokens for ch in tok)


def plot_attention_grid(
    attention: Tensor,
    tokens: list[str],
    out: str | Path,
    *,
    token_share: Tensor | None = None,
    title: str = "",
) -> Path:
    """Save a grid of heatmaps, one per layer (rows) × head (columns), to ``out`` (PNG/PDF/SVG).

    attention: (L, H, T, T) for one input, rows = queries, columns = keys. ``token_share``
    (T,) adds a bar chart of how much each token feeds the pooled representation.
    """
    L, H, T, _ = attention.shape
    if len(tokens) != T:
        raise UserError(f"{len(tokens)} token labels for attention over {T} positions")
    font = cjk_font()
    if font is None and _needs_cjk(tokens):
        warnings.warn(
            "no CJK font found, Chinese labels will show as boxes; install one with "
            "`apt-get install fonts-wqy-microhei` (scripts/setup.sh does this)",
            stacklevel=2,
        )
    cell = max(1.6, 0.22 * T)
    extra_rows = 1 if token_share is not None else 0
    fig, axes = plt.subplots(
        L + extra_rows, H, figsize=(cell * H + 1, cell * (L + extra_rows) + 1), squeeze=False
    )
    label_size = max(5, min(10, 200 // max(T, 1)))
    for layer in range(L):
        for head in range(H):
            ax = axes[layer][head]
            ax.imshow(attention[layer, head].float().cpu().numpy(), cmap="viridis", vmin=0)
            ax.set_title(f"layer {layer + 1} · head {head + 1}", fontsize=9)
            ax.set_xticks(range(T))
            ax.set_yticks(range(T))
            ax.set_xticklabels(tokens, fontproperties=font, fontsize=label_size, rotation=90)
            ax.set_yticklabels(tokens, fontproperties=font, fontsize=label_size)
            ax.tick_params(length=0)
    if token_share is not None:
        gs = axes[L][0].get_gridspec()
        for ax in axes[L]:
            ax.remove()
        ax = fig.add_subplot(gs[L, :])
        ax.bar(range(T), token_share.float().cpu().numpy(), color="tab:orange")
        ax.set_xticks(range(T))
        ax.set_xticklabels(tokens, fontproperties=font, fontsize=max(label_size, 8))
        ax.set_ylabel("share of pooled vector")
        ax.set_title("which tokens the pooled representation leans on (attention rollout)")
    if title:
        fig.suptitle(title, fontproperties=font, fontsize=12)
    return _save(fig, out)


def plot_confusion(
    matrix: list[list[int]], labels: list[str], out: str | Path, title: str = ""
) -> Path:
    """Save a confusion matrix (rows = true class, columns = predicted) as a picture: each
    cell its count, shaded by the share of its true class (a row sums to one)."""
    import numpy as np

    counts = np.asarray(matrix, dtype=np.int64)  # (C, C)
    C = len(labels)
    if counts.shape != (C, C):
        raise UserError(f"a {counts.shape} confusion matrix for {C} labels")
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)  # (C, C)
    font = cjk_font()
    size = max(3.5, 0.6 * C + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, fraction=0.046, label="share of the true class")
    ax.set_xticks(range(C))
    ax.set_yticks(range(C))
    ax.set_xticklabels(labels, fontproperties=font, rotation=45 if C > 4 else 0, ha="right"
                       if C > 4 else "center")  # fmt: skip
    ax.set_yticklabels(labels, fontproperties=font)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for i in range(C):
        for j in range(C):
            color = "white" if shares[i, j] > 0.5 else "black"
            ax.text(j, i, str(counts[i, j]), ha="center", va="center", color=color,
                    fontsize=max(6, 12 - C // 4))  # fmt: skip
    if title:
        ax.set_title(title, fontproperties=font)
    return _save(fig, out)


def _save(fig: plt.Figure, out: str | Path) -> Path:
    """Lay ``fig`` out, write it to ``out`` (its folder made) and close it."""
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
