"""Explorer page size and render time in headless chromium: a typical input and 1,000 tokens.

Pages come from models of the README's default shapes with random weights (sizes and render
times do not depend on training): the character classifier (2 layers x 4 heads, d_model 128)
on the tutorial's 17-character review and on a 1,000-character text, and the shipped MiniLM
(6 x 12) on a 12-word sentence. For each page: file size, and in chromium the time from
navigation to the first drawn view (parse + base64 decode + head view), then the time each
other view takes to draw (the page's own performance.now() figure).

    python -m benchmarks.explore.render [--rounds 3]   # -> docs/results/explore_render.{json,md}
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from attnlab.data import CharTokenizer, LabelVocab
from attnlab.explore.page import explore_data, render_page
from attnlab.explore.sources import load_source
from attnlab.finetune.distill import DistillConfig
from attnlab.models.classifier import ClassifierConfig, build_classifier
from attnlab.runs.task import RunConfig
from attnlab.tasks.classify import CharData
from attnlab.train import TrainConfig, save_weights
from benchmarks import common

TYPICAL = "电影前半段很无聊，但是结局让我感动"  # the tutorial's third example, 17 characters
SENTENCE = "The quick brown fox jumps over the lazy dog near the quiet river bank."


def classifier_run(root: Path, max_len: int) -> Path:
    """A default-shaped classifier run folder (random weights) whose inputs may be max_len long."""
    run = root / f"classify-{max_len}"
    run.mkdir()
    tok = CharTokenizer.build([TYPICAL * 3, "好看极了精彩感人剧情拖沓"], min_freq=1)
    tok.save(run / "tokenizer.json")
    LabelVocab.build(["positive", "negative"]).save(run / "labels.json")
    cfg = ClassifierConfig(vocab_size=tok.vocab_size, context=max_len + 1)
    sections = {"data": CharData(truncate_len=max_len), "model": cfg, "train": TrainConfig(),
                "distill": DistillConfig()}  # fmt: skip
    config = RunConfig("classify", sections, "char")
    (run / "config.json").write_text(json.dumps(config.to_json()))
    (run / "data_report.json").write_text(json.dumps({"max_len": max_len + 1}))
    torch.manual_seed(0)
    save_weights(build_classifier(cfg), run / "model.safetensors")
    return run


def measure(browser, page: Path, rounds: int) -> dict:
    """Best of ``rounds``: navigation to first view drawn, and each view's own draw time."""
    first, views = [], {}
    for _ in range(rounds):
        tab = browser.new_page(viewport={"width": 1200, "height": 900})
        start = time.perf_counter()
        tab.goto(page.resolve().as_uri())
        tab.wait_for_selector("body[data-ready='1']", timeout=120_000)
        first.append(time.perf_counter() - start)
        names = tab.eval_on_selector_all("#tabs button", "b => b.map(x => x.dataset.view)")
        for name in names[1:]:
            tab.click(f"#tabs button[data-view='{name}']")
            ms = float(tab.get_attribute("#view", "data-render-ms"))
            views[name] = min(views.get(name, ms), ms)
        tab.close()
    return {"first_view_s": round(min(first), 3), "view_ms": views}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed page loads, best kept")
    parser.add_argument("--name", default="explore_render", help="results file stem")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("needs Debian's chromium (apt-get install chromium)")
    info = common.machine(threads=common.set_threads(1))
    cases = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        root = Path(tmp)
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        long_text = (TYPICAL * 60)[:1000]
        for name, run, text, max_chars in (
            ("classifier, 17 characters", classifier_run(root, 64), TYPICAL, 2000),
            ("classifier, 1,000 characters", classifier_run(root, 1000), long_text, 2000),
            ("MiniLM, 12 words", "minilm", SENTENCE, 2000),
        ):
            data = explore_data(load_source(run), [text], max_chars=max_chars)
            page = root / f"{len(cases)}.html"
            page.write_text(render_page(data), encoding="utf-8")
            group = data["examples"][0]["groups"][0]
            case = {
                "case": name,
                "tokens": group["tq"],
                "layers_x_heads": f"{group['layers']}x{group['heads']}",
                "raw_scores_kept": group["scores"] is not None,
                "page_bytes": page.stat().st_size,
                **measure(browser, page, args.rounds),
            }
            print(case, flush=True)
            cases.append(case)
        browser.close()
        version = browser.version
    result = {
        "cases": cases,
        "browser": f"chromium {version} (headless, Playwright)",
        "rounds": args.rounds,
        "machine": {**info, "load_average_at_end": common.load_average()},
    }
    lines = [
        "# Explorer page size and render time",
        "",
        f"{result['browser']}, best of {args.rounds}.",
        "",
        common.machine_line(result["machine"]) + " Other jobs share the machine.",
        "",
        "| page | tokens | layers x heads | raw scores | page size | open -> first view | "
        "matrix view | scale view |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        v = c["view_ms"]
        lines.append(
            f"| {c['case']} | {c['tokens']} | {c['layers_x_heads']} | "
            f"{'kept' if c['raw_scores_kept'] else 'left out (budget)'} | "
            f"{c['page_bytes'] / 1024:,.0f} KiB | {c['first_view_s']:.2f} s | "
            f"{v.get('matrix', 0):.0f} ms | {v.get('scale', 0):.0f} ms |"
        )
    _, md_path = common.write_results(args.name, result, lines)
    print(md_path.read_text())


if __name__ == "__main__":
    main()
