"""One block's forward + backward time and peak memory against sequence length T.

For each attention kind (explicit full attention, PyTorch's fused kernel, local, linear) and
each T, one fresh process (:func:`attnlab.bench.memory.run_isolated`) measures the peak memory
of a step and the median time of a few more. Guards, so that no point exhausts the machine:
the memory of a point is estimated first from the attention size (explicit full attention
keeps about six B·H·T² float32 tensors for the backward pass; the others grow linearly) and
the point is skipped above ``mem_limit_gib``; its time is predicted from the previous point
(T² for full attention, T otherwise) and the point skipped above ``time_cap_s``. The exponent
k of time ∝ T^k (and memory) is the least-squares slope of log y on log T over the points
with T ≥ ``fit_from``.
"""

from __future__ import annotations

import math

from attnlab.bench.memory import run_isolated

KINDS = ("explicit", "fused", "local", "linear")
QUADRATIC_TIME = {"explicit", "fused"}


def estimate_mib(kind: str, T: int, batch: int, d_model: int, n_heads: int) -> float:
    """Rough peak of one step: activations linear in T, plus T² scores for explicit."""
    linear = 40 * batch * T * d_model * 4  # ~40 (B, T, D)-sized float32 tensors per block
    quadratic = 6 * batch * n_heads * T * T * 4 if kind == "explicit" else 0
    return (linear + quadratic) / 2**20


def fit_exponent(points: list[tuple[int, float]], fit_from: int) -> float | None:
    """Slope of log y against log T over points with T >= fit_from (None if < 2 points)."""
    pts = [(math.log(t), math.log(y)) for t, y in points if t >= fit_from and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def run_scaling(
    lengths: list[int],
    *,
    kinds: tuple[str, ...] = KINDS,
    batch: int = 1,
    d_model: int = 256,
    n_heads: int = 4,
    window: int = 256,
    threads: int = 1,
    device: str = "cpu",
    repeats: int = 2,
    time_cap_s: float = 60.0,
    mem_limit_gib: float = 12.0,
    fit_from: int = 1024,
    log=print,
) -> dict:
    """Measure every (kind, T); return settings, points (or skip reasons) and exponents."""
    settings = dict(
        batch=batch,
        d_model=d_model,
        n_heads=n_heads,
        head_dim=d_model // n_heads,
        window=window,
        threads=threads,
        device=device,
        repeats=repeats,
        time_cap_s=time_cap_s,
        mem_limit_gib=mem_limit_gib,
        fit_from=fit_from,
        causal=True,
        dtype="float32",
    )
    points: dict[str, list[dict]] = {}
    for kind in kinds:
        points[kind] = []
        last: tuple[int, float] | None = None
        for T in lengths:
            est = estimate_mib(kind, T, batch, d_model, n_heads)
            row: dict = {"T": T, "estimated_mib": round(est)}
            power = 2 if kind in QUADRATIC_TIME else 1
            predicted = None if last is None else last[1] * (T / last[0]) ** power
            if est > mem_limit_gib * 1024:
                row["skipped"] = f"estimated {est / 1024:.1f} GiB > limit {mem_limit_gib} GiB"
            elif predicted is not None and predicted > time_cap_s:
                row["skipped"] = f"predicted {predicted:.0f} s per step > cap {time_cap_s:.0f} s"
            else:
                spec = dict(
                    case="block",
                    kind=kind,
                    T=T,
                    batch=batch,
                    d_model=d_model,
                    n_heads=n_heads,
                    window=window,
                    threads=threads,
                    device=device,
                    repeats=repeats,
                    time_cap_s=time_cap_s,
                )
                res = run_isolated(spec, timeout_s=30 + 4 * time_cap_s)
                if "error" in res:
                    row["skipped"] = res["error"]
                else:
                    row.update(
                        ms=round(res["median_ms"], 2),
                        peak_mib=round(res["peak_mib"], 1),
                        steps_timed=res["steps_timed"],
                    )
                    last = (T, res["median_ms"] / 1e3)
            log(
                f"  {kind:8s} T={T:6d} "
                + (
                    f"skipped: {row['skipped']}"
                    if "skipped" in row
                    else f"{row['ms']:10.1f} ms  {row['peak_mib']:8.1f} MiB"
                )
            )
            points[kind].append(row)
    exponents = {
        kind: {
            metric: fit_exponent([(r["T"], r[metric]) for r in rows if metric in r], fit_from)
            for metric in ("ms", "peak_mib")
        }
        for kind, rows in points.items()
    }
    return {"settings": settings, "points": points, "exponents": exponents}


def plot_scaling(result: dict, path) -> None:
    """Log-log plot of time and peak memory against T, one line per kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, label in zip(
        axes, ("ms", "peak_mib"), ("time of forward + backward (ms)", "peak memory (MiB)")
    ):
        for kind, rows in result["points"].items():
            pts = [(r["T"], r[metric]) for r in rows if metric in r]
            if not pts:
                continue
            k = result["exponents"][kind][metric]
            name = kind if k is None else f"{kind} (slope {k:.2f})"
            ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    s = result["settings"]
    fig.suptitle(
        f"one causal pre-norm block, d_model {s['d_model']}, {s['n_heads']} heads, batch "
        f"{s['batch']}, local window {s['window']}, {s['threads']} thread(s), {s['device']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
