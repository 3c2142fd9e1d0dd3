"""Weight-space ensembling of a main-job run with the pretrained encoder (WiSE-FT, Wortsman et
al. 2022, "Robust fine-tuning of zero-shot models"): does mixing the fine-tuned blocks back
toward multilingual-e5-small's own weights read out-of-domain text better?

For each run and each ``alpha`` the trained blocks (those the run fine-tuned: the top
``train_layers``) become

    theta(alpha) = (1 - alpha) * theta_pretrained + alpha * theta_fine-tuned       (WiSE-FT, eq. 1)

the rest of the model (the frozen blocks, the embeddings, the head) as the run saved it; alpha 1
is the run itself, alpha 0 the pretrained blocks under the fine-tuned head (which moves little
from the LP-FT probe it starts as: alpha 0 reads about as the frozen encoder's probe). Each
mixture reads
the run's validation split (the set a choice of alpha may read, with OOD dev), the OOD dev and
test sets (all, their film and series sentences, their turned ones) and the tutorial's third
sentence, through the Python API (``attnlab.load``), as predict reads them.

    python -m benchmarks.classify.wise_ft RUN [RUN ...] --alphas 1,0.9,0.8,0.6,0.4,0
    python -m benchmarks.classify.wise_ft --render      # the page again from its JSON
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import common

STEM = "wise_ft"
THIRD = "电影前半段很无聊，但是结局让我感动"
FILM = ("film", "series")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", type=Path, help="main-job run folders (e5)")
    p.add_argument("--alphas", default="1,0.9,0.8,0.6,0.4,0", help="comma-separated, 0..1")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--render", action="store_true", help="rewrite the page from its JSON")
    return p


def sets(run_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """(text, label) of each set scored: the run's validation split and the OOD subsets."""
    from attnlab.data.corpora import load_chinese_reviews
    from attnlab.data.sentiment import load_ood

    corpus = load_chinese_reviews()
    split = json.loads((run_dir / "split.json").read_text(encoding="utf-8"))["indices"]
    out = {"val": [(corpus.texts[i], corpus.labels[i]) for i in split["val"]]}
    for name in ("dev", "test"):
        ood, tags = load_ood(name)
        pairs = list(zip(ood.texts, ood.labels))
        out[f"OOD {name}"] = pairs
        out[f"OOD {name} film+series"] = [p for p, t in zip(pairs, tags) if t["domain"] in FILM]
        out[f"转折 {name}"] = [p for p, t in zip(pairs, tags) if t["phenomenon"] == "contrast"]
    return out


def sweep(run_dir: Path, alphas: list[float], threads: int) -> list[dict]:
    """One row per alpha: accuracy on every set, p(positive) of the third sentence."""
    import torch

    import attnlab
    from attnlab.models.e5 import load_e5

    api = attnlab.load(run_dir, threads=threads)
    model = api.run.model
    tuned = {k: v.clone() for k, v in model.state_dict().items()}
    pretrained = {f"bert.{k}": v for k, v in load_e5()[0].state_dict().items()}
    frozen_below = len(model.bert.encoder.blocks) - api.run.config.data.train_layers
    moved = [k for k in tuned if k.startswith("bert.encoder.blocks.")
             and int(k.split(".")[3]) >= frozen_below]  # fmt: skip
    scored = sets(run_dir)
    rows = []
    for alpha in alphas:
        state = dict(tuned)
        for k in moved:  # WiSE-FT, eq. 1
            state[k] = (1 - alpha) * pretrained[k].to(tuned[k].dtype) + alpha * tuned[k]
        model.load_state_dict(state)
        row: dict = {"run": str(run_dir), "alpha": alpha}
        with torch.inference_mode():
            for name, pairs in scored.items():
                out = api.predict([t for t, _ in pairs])
                row[name] = sum(o["label"] == y for o, (_, y) in zip(out, pairs)) / len(pairs)
            row["third"] = api.predict([THIRD])[0]["probs"]["positive"]
        rows.append(row)
        print(json.dumps(row, ensure_ascii=False), flush=True)
    return rows


def table(rows: list[dict], columns: list[str]) -> list[str]:
    lines = ["| run | alpha | " + " | ".join(columns) + " | third |",
             "|---|---|" + "---|" * len(columns) + "---|"]  # fmt: skip
    for r in rows:
        cells = " | ".join(f"{r[c]:.3f}" for c in columns)
        lines.append(f"| {Path(r['run']).name} | {r['alpha']:g} | {cells} | {r['third']:.2f} |")
    return lines


def means(rows: list[dict], columns: list[str]) -> list[str]:
    alphas = sorted({r["alpha"] for r in rows}, reverse=True)
    lines = ["| alpha | runs | " + " | ".join(columns) + " |",
             "|---|---|" + "---|" * len(columns)]  # fmt: skip
    for a in alphas:
        group = [r for r in rows if r["alpha"] == a]
        cells = " | ".join(f"{sum(r[c] for r in group) / len(group):.3f}" for c in columns)
        lines.append(f"| {a:g} | {len(group)} | {cells} |")
    return lines


DESCRIPTION = (
    "Each run's fine-tuned blocks (the top 4 of 12) become theta(alpha) = (1 - alpha) * "
    "theta_pretrained + alpha * theta_fine-tuned (Wortsman et al. 2022, eq. 1); the frozen "
    "blocks, the embeddings and the head stay as the run saved them. Alpha 1 is the run itself; "
    "at alpha 0 the pretrained blocks sit under the fine-tuned head, which moves little from the "
    "LP-FT probe it starts as, so alpha 0 reads about as the frozen encoder's probe (the same in "
    "every seed). Accuracy on each set, as predict reads it: validation n = 1,736 and OOD dev "
    "n = 210 (the sets a choice of alpha may read), OOD test n = 210; film + series 120 of each "
    "OOD set, 转折 38 of each; third: p(positive) of the tutorial's turned sentence."
)


def page(rows: list[dict], info: dict) -> list[str]:
    columns = [c for c in rows[0] if c not in ("run", "alpha", "third")]
    return [
        "# WiSE-FT: the main job's fine-tuned blocks mixed back toward the pretrained encoder",
        "",
        common.machine_line(info),
        "",
        DESCRIPTION,
        "",
        "Mean over the runs:",
        "",
        *means(rows, columns),
        "",
        "Each run:",
        "",
        *table(rows, columns),
    ]


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.render:
        path = common.RESULTS / f"{STEM}.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        command = common.recorded_command(data, path.with_suffix(".md"))
        common.write_results(STEM, data, page(data["rows"], data["machine"]), command)
        return
    if not args.runs:
        raise SystemExit("give one or more main-job run folders (or --render)")
    alphas = [float(a) for a in args.alphas.split(",")]
    if not all(0.0 <= a <= 1.0 for a in alphas):
        raise SystemExit(f"--alphas {args.alphas}: each must lie in 0..1")
    info = common.machine(threads=common.set_threads(args.threads))
    rows = [row for run in args.runs for row in sweep(run, alphas, args.threads)]
    info["load_average_at_end"] = common.load_average()
    common.write_results(STEM, {"machine": info, "rows": rows}, page(rows, info))


if __name__ == "__main__":
    main()
