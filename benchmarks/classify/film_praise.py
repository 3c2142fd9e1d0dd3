"""Film praise, looked at: how a main-job run reads film sentences that praise in a product's
words of complaint (laughter, tears, a twist, thrills, a slow start that pays off).

The sentences below were written for this page, as evaluation text only: they never enter
training. For each run given, the page lists every sentence's p(positive); for the first run it
draws `attnlab attention`'s heatmaps and `attnlab explore`'s token view (a PNG of the page, with
chromium) of the sentences it misreads, so one can see which pieces the pooled vector leans on.
The OOD sets' film and series errors of the recipes are on classify_e5.md ("misread").

    python -m benchmarks.classify.film_praise RUN [RUN ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks import common

STEM = "film_praise"
IMAGES = common.ROOT / "docs" / "img" / "film_praise"
HEATMAPS = 3  # misread sentences drawn layer x head (~0.4 MB each); the explorer's view of all

# (sentence, its label, what kind of praise or complaint): written for this page
SENTENCES = (
    ("这部喜剧让我笑得肚子疼，全场爆笑。", "positive", "laughter"),
    ("看到最后我哭成了泪人，太好哭了。", "positive", "tears"),
    ("结局的反转完全没想到，编剧太会了。", "positive", "a twist admired"),
    ("全程心跳加速，紧张得不敢眨眼。", "positive", "thrills"),
    ("开头有点慢热，越往后越精彩。", "positive", "a slow start that pays off"),
    ("恐怖片就该这么吓人，晚上不敢关灯。", "positive", "fear as praise"),
    ("这部电影太烧脑了，看完还想二刷。", "positive", "a puzzle admired"),
    ("演员的表演让人起鸡皮疙瘩。", "positive", "goose bumps"),
    ("剧情老套，全程都在打哈欠。", "negative", "boredom"),
    ("特效很假，台词尴尬得让人出戏。", "negative", "fake, awkward"),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="main-job run folders")
    p.add_argument("--name", action="append", default=[], help="a label per run, in order")
    p.add_argument("--no-png", action="store_true", help="skip the explorer screenshots")
    return p


def attnlab(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "attnlab", *argv], check=True)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from attnlab.infer.classifier import ClassifierRun

    info = common.machine()
    names = args.name + [d.name for d in args.runs[len(args.name) :]]
    texts = [t for t, _, _ in SENTENCES]
    rows = {}
    for name, run_dir in zip(names, args.runs):
        preds = ClassifierRun.load(run_dir).predict(texts)
        rows[name] = [round(p["probs"]["positive"], 3) for p in preds]
    first = rows[names[0]]
    misread = [i for i, (p, (_, label, _)) in enumerate(zip(first, SENTENCES))
               if (p >= 0.5) != (label == "positive")]  # fmt: skip
    IMAGES.mkdir(parents=True, exist_ok=True)
    drawn = []
    for k, i in enumerate(misread):
        heat = IMAGES / f"attention_{k + 1}.png" if k < HEATMAPS else None
        if heat:
            attnlab("attention", str(args.runs[0]), texts[i], "--out", str(heat))
            shrink(heat)
        page = IMAGES / f"explore_{k + 1}.html"
        png = [] if args.no_png else ["--png", str(IMAGES / f"explore_{k + 1}.png"), "--view",
                                      "tokens"]  # fmt: skip
        attnlab("explore", str(args.runs[0]), texts[i], "--out", str(page), *png)
        page.unlink()  # the PNG is what the page shows; the HTML is the run's to make again
        tokens = None if args.no_png else f"explore_{k + 1}.png"
        drawn.append((i, heat.name if heat else None, tokens))
    data = {"sentences": [list(s) for s in SENTENCES], "p_positive": rows,
            "misread_by_first": misread, "machine": {**info, "load_average_at_end":
                                                     common.load_average()}}  # fmt: skip
    common.write_results(STEM, data, render(data, names, drawn), common.command_line())
    print(json.dumps(rows, ensure_ascii=False))


def shrink(png: Path, width: int = 1200) -> None:
    """A 144-panel heatmap PNG at a width a page shows, in 256 colours (megabytes -> a few
    hundred kilobytes in the repository)."""
    from PIL import Image

    with Image.open(png) as im:
        small = im.convert("RGB").resize((width, round(im.height * width / im.width)),
                                         Image.Resampling.LANCZOS)  # fmt: skip
    small.quantize(256).save(png, optimize=True)


def render(data: dict, names: list[str], drawn: list) -> list[str]:
    rows = data["p_positive"]
    lines = [
        "# Film praise, looked at",
        "",
        common.machine_line(data["machine"]),
        "",
        "Sentences written for this page (evaluation only, never trained on): film praise in "
        "words a shopping or hotel review would use to complain, and two plain complaints. "
        "p(positive) from each run's predict; a sentence is misread when p falls on the wrong "
        "side of 0.5.",
        "",
        "| sentence | label | kind | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for i, (text, label, kind) in enumerate(data["sentences"]):
        cells = []
        for name in names:
            p = rows[name][i]
            wrong = (p >= 0.5) != (label == "positive")
            cells.append(f"**{p:.2f}**" if wrong else f"{p:.2f}")
        lines.append(f"| {text} | {label} | {kind} | " + " | ".join(cells) + " |")
    lines += ["", f"Misread by {names[0]} (bold above), and what it leans on:", ""]
    if not drawn:
        lines.append("None: every sentence is read right.")
    for i, heat, png in drawn:
        views = []
        if heat:
            views.append(f"`attnlab attention` ![heatmaps](../img/film_praise/{heat})")
        if png:
            views.append(f"`attnlab explore`'s token view ![tokens](../img/film_praise/{png})")
        lines.append(f"- {data['sentences'][i][0]}: " + "\n  and ".join(views or ["(not drawn)"]))
    return lines


if __name__ == "__main__":
    main()
