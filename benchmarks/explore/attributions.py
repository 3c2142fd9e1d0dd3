"""Which pieces a fine-tuned classifier leans on: integrated gradients on the tutorial's three
sentences and ten turned (转折) sentences of the bundled out-of-domain dev set.

The ten: in each of the first five domains of ``src/attnlab/data/sentiment_ood/dev.tsv`` (file
order: film, series, restaurant, hotel, game), the first positive and the first negative row
whose ``phenomenon`` is ``contrast`` (the set's tag for a turn). For each sentence: the run's
prediction, every piece's score (attnlab.infer.attribution: integrated gradients over the word
vectors, 32 Gauss–Legendre steps, the predicted label's log-odds, the text's pieces blanked to
``<pad>`` in the reference), the completeness gap, the share of the scores' mass on the clause
after the first comma (where a turn puts its verdict), and, for comparison, the share attention
rollout (the explorer's old token view) gives to ``<s>``, ``</s>`` and the ``query:`` prefix.

    python -m benchmarks.explore.attributions --run /work/runs/before_s0
    # -> docs/results/attributions.{json,md}, docs/img/attributions.png
"""

from __future__ import annotations

import argparse
import html
import json
import platform
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

import torch

from attnlab.data.sentiment import TUTORIAL_EXAMPLES, load_ood
from attnlab.infer.attribution import piece_attribution
from attnlab.infer.classifier import ClassifierRun
from attnlab.infer.describe import encoder_name

ROOT = Path(__file__).resolve().parents[2]
COMMAS = {",", "，", "▁,"}


def turned_sentences(per_domain: int = 1, domains: int = 5) -> list[tuple[str, str, str]]:
    """(text, label, domain): the first positive and negative contrast row of each of the first
    ``domains`` domains of the dev set, in file order."""
    corpus, tags = load_ood("dev")
    order: list[str] = []
    picked: dict[tuple[str, str], list[str]] = {}
    for text, label, tag in zip(corpus.texts, corpus.labels, tags):
        if tag["phenomenon"] != "contrast":
            continue
        if tag["domain"] not in order:
            order.append(tag["domain"])
        rows = picked.setdefault((tag["domain"], label), [])
        if len(rows) < per_domain:
            rows.append(text)
    out = []
    for domain in order[:domains]:
        for label in ("positive", "negative"):
            out += [(text, label, domain) for text in picked.get((domain, label), [])]
    return out


def clause_split(tokens: list[str], roles: list[str]) -> int | None:
    """Index of the first text piece after the first comma piece, or None."""
    for i, (tok, role) in enumerate(zip(tokens, roles)):
        if role == "text" and tok in COMMAS:
            return i + 1
    return None


def study(run: ClassifierRun, text: str, gold: str, group: str) -> dict:
    (pred,) = run.predict([text])
    a = piece_attribution(run, text)
    text_idx = [i for i, r in enumerate(a["roles"]) if r == "text"]
    mass = sum(abs(a["scores"][i]) for i in text_idx) or 1.0
    cut = clause_split(a["tokens"], a["roles"])
    after = sum(abs(a["scores"][i]) for i in text_idx if cut is not None and i >= cut) / mass
    share = run.attention(text)["token_share"].tolist()  # attention rollout (T,)
    fixed = sum(s for s, r in zip(share, a["roles"]) if r != "text")
    ranked = sorted(text_idx, key=lambda i: -a["scores"][i])
    return {
        "text": text, "group": group, "gold": gold, "label": pred["label"],
        "prob": pred["probs"][pred["label"]], "attribution": a,
        "top_for": [(a["tokens"][i], a["scores"][i]) for i in ranked[:3] if a["scores"][i] > 0],
        "top_against": [(a["tokens"][i], a["scores"][i]) for i in ranked[::-1][:2]
                        if a["scores"][i] < 0],
        "second_clause_share": after if cut is not None else None,
        "rollout_on_fixed": fixed,
    }  # fmt: skip


def picture(rows: list[dict], out: Path, model: str) -> None:
    """The sentences as coloured pieces, drawn by headless chromium with the page's colours."""
    from playwright.sync_api import sync_playwright

    js = resources.files("attnlab.explore").joinpath("assets", "pieces.js").read_text("utf-8")
    lines = []
    for r in rows:
        a = r["attribution"]
        text = [i for i, role in enumerate(a["roles"]) if role == "text"]
        peak = max(abs(a["scores"][i]) for i in text) or 1.0
        chips = "".join(
            f'<span class="p" data-v="{a["scores"][i] / peak:.4f}">'
            f"{html.escape(a['tokens'][i].replace('▁', ' ').strip() or '▁')}</span>"
            for i in text
        )
        mark = "" if r["label"] == r["gold"] else " ✗"
        lines.append(
            f'<div class="row"><span class="lab">{html.escape(r["label"])} '
            f"{r['prob']:.2f}{mark}</span>{chips}</div>"
        )
    page = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><style>
body {{ font: 17px "WenQuanYi Micro Hei", sans-serif; margin: 14px; background: #fff; }}
.row {{ margin: 5px 0; white-space: nowrap; }}
.lab {{ display: inline-block; width: 118px; color: #444; font-size: 14px; }}
.p {{ display: inline-block; padding: 1px 4px; margin: 0 1px; border-radius: 3px; }}
.key {{ color: #555; font-size: 13px; margin-bottom: 8px; }}
</style></head><body>
<div class="key">{html.escape(model)}, fine-tuned · integrated gradients · orange: pushed
towards the predicted label, blue: against (each row scaled to its strongest piece; ▁ starts a word;
✗ a wrong label)</div>
{"".join(lines)}<script>{js}
for (const p of document.querySelectorAll(".p")) p.style.background = piecesColor(+p.dataset.v);
</script></body></html>"""
    chromium = shutil.which("chromium")
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        path = Path(tmp) / "a.html"
        path.write_text(page, encoding="utf-8")
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 900, "height": 400}, device_scale_factor=2)
        tab.goto(path.as_uri())
        tab.locator("body").screenshot(path=str(out))
        browser.close()


def fmt_pieces(pairs: list) -> str:
    return " · ".join(f"{t.replace('▁', '') or '▁'} {v:+.2f}" for t, v in pairs) or "–"


def markdown(rows: list[dict], meta: dict) -> str:
    out = [
        "# Which pieces the fine-tuned classifier leans on",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Run `{meta['run']}` ({meta['model']}, fine-tuned), torch {meta['torch']}, float32, "
        f"{meta['threads']} thread; nothing here is timed.",
        "",
        "Scores are integrated gradients over the word vectors (32 Gauss–Legendre steps) of the "
        "predicted label's log-odds, log p/(1−p), against a reference where every piece of the "
        "text is `<pad>` and `<s>`, `</s>` and the `query: ` prefix stay (they are in every "
        "input and take no score). A piece's score is its part of the change in log-odds; "
        "positive pushed towards the predicted label. The scores add up to the change "
        f"(largest completeness gap {meta['max_gap']:.1e}). The method is tested against "
        "captum's IntegratedGradients (tests/explore/test_attribution.py).",
        "",
        "The ten turned sentences: in each of the first five domains of the bundled "
        "out-of-domain dev set (`src/attnlab/data/sentiment_ood/dev.tsv`: film, series, "
        "restaurant, hotel, game), the first positive and the first negative row tagged "
        "`contrast`.",
        "",
        "![pieces coloured by their score](../img/attributions.png)",
        "",
        "| sentence | gold | predicted | leans on (top 3) | against | 2nd clause's share | "
        "rollout on `<s>`/`</s>`/prefix |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        second = "–" if r["second_clause_share"] is None else f"{r['second_clause_share']:.0%}"
        wrong = "" if r["label"] == r["gold"] else " **(wrong)**"
        out.append(
            f"| {r['text']} | {r['gold']} | {r['label']} {r['prob']:.3f}{wrong} | "
            f"{fmt_pieces(r['top_for'])} | {fmt_pieces(r['top_against'])} | {second} | "
            f"{r['rollout_on_fixed']:.0%} |"
        )
    turned = [r for r in rows if r["group"] != "tutorial" and r["second_clause_share"] is not None]
    mean = sum(r["second_clause_share"] for r in turned) / max(len(turned), 1)
    out += [
        "",
        f"On the ten turned sentences the clause after the first comma (where the turn puts its "
        f"verdict) holds on average {mean:.0%} of the pieces' absolute scores. "
        f"Attention rollout, which the explorer's token view showed before, gives "
        f"{meta['rollout_fixed_mean']:.0%} of each sentence's share on average to `<s>`, `</s>` "
        "and the prefix: it says where attention flows, not which words decided.",
        "",
        "Columns: *leans on*: the three pieces with the largest positive score (▁ marks a word "
        "start); *against*: up to two pieces with a negative score; *2nd clause's share*: the "
        "share of the text pieces' absolute scores after the first comma.",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="/work/runs/before_s0")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "attributions"))
    parser.add_argument("--img", default=str(ROOT / "docs" / "img" / "attributions.png"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    run = ClassifierRun.load(args.run)
    todo = [(t, label, "tutorial") for t, label in TUTORIAL_EXAMPLES]
    todo += turned_sentences()
    rows = []
    for k, (text, gold, group) in enumerate(todo):
        rows.append(study(run, text, gold, group))
        print(f"[{k + 1}/{len(todo)}] {text} -> {rows[-1]['label']}", file=sys.stderr)
    meta = {
        "run": Path(args.run).name,
        "model": encoder_name(run, "BERT"),
        "command": "python -m benchmarks.explore.attributions --run " + args.run,
        "torch": torch.__version__,
        "threads": 1,
        "machine": platform.machine(),
        "max_gap": max(abs(r["attribution"]["gap"]) for r in rows),
        "rollout_fixed_mean": sum(r["rollout_on_fixed"] for r in rows) / len(rows),
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "rows": rows}, ensure_ascii=False, indent=1), encoding="utf-8"
    )
    out.with_suffix(".md").write_text(markdown(rows, meta), encoding="utf-8")
    picture(rows, Path(args.img), meta["model"])
    print(f"written {out.with_suffix('.md')}, {out.with_suffix('.json')} and {args.img}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
