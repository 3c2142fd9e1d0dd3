"""Is one translation run better than another, or within noise? sacreBLEU's paired bootstrap.

python -m benchmarks.translate.compare docs/results/translate_ende \
    docs/results/translate_ende_torch --out docs/results/translate_ende_vs_torch

Each argument is a results stem written by benchmarks.translate.train (its .json names the
command; the run directory defaults to runs/bench-translate-<stem name>, where it kept the
beam and greedy hypotheses as test.beam.txt and test.greedy.txt). Both runs must translate the
same test split. For beam and greedy, sacreBLEU's paired bootstrap resampling (Koehn 2004; 1000
resamples of the test sentences, seed 12345) gives each system's BLEU and chrF with a 95%
confidence interval, and the p-value of the second system differing from the first.
"""

from __future__ import annotations

import argparse
import json
import unicodedata
from pathlib import Path

import sacrebleu
from sacrebleu.significance import PairedTest

from attnlab.tasks.translate import bleu_tokenize, run_pairs
from benchmarks import common
from benchmarks.translate._runs import read_run_config


def test_references(run: Path) -> tuple[list[str], str]:
    """The NFKC-normalised test references of a run and its BLEU tokenizer."""
    cfg = read_run_config(run)
    refs = [unicodedata.normalize("NFKC", p.tgt) for p in run_pairs(cfg, "test")]
    return refs, bleu_tokenize(cfg.data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("first", type=Path, help="results stem of the first (baseline) run")
    parser.add_argument("second", type=Path, help="results stem of the second run")
    parser.add_argument("--out", type=Path, required=True, help="results stem to write")
    parser.add_argument("--samples", type=int, default=1000, help="bootstrap resamples")
    args = parser.parse_args(argv)
    stems = (args.first, args.second)
    reports = [json.loads(s.with_suffix(".json").read_text()) for s in stems]
    runs = [Path(r.get("run", f"runs/bench-translate-{s.name}")) for r, s in zip(reports, stems)]
    refs, tokenize = test_references(runs[0])
    if test_references(runs[1]) != (refs, tokenize):
        raise SystemExit("the two runs translate different test splits; nothing to compare")
    names = [s.name for s in stems]
    out: dict = {"systems": names, "commands": [r.get("command", "") for r in reports]}
    rows = []
    for decoding in ("beam", "greedy"):
        hyps = [(run / f"test.{decoding}.txt").read_text().splitlines() for run in runs]
        if any(len(h) != len(refs) for h in hyps):
            raise SystemExit(f"test.{decoding}.txt does not hold one line per test pair")
        metrics = {"BLEU": sacrebleu.BLEU(tokenize=tokenize), "chrF": sacrebleu.CHRF()}
        test = PairedTest(
            list(zip(names, hyps)), metrics, [refs], test_type="bs", n_samples=args.samples
        )
        signatures, scores = test()
        result: dict = {}
        for metric in scores:
            if metric == "System":
                continue
            first, second = scores[metric]  # keyed by the metrics' own names: BLEU, chrF2
            result[metric] = {
                names[0]: {
                    "score": first.score,
                    "mean": float(first.mean),
                    "ci95": float(first.ci),
                },
                names[1]: {
                    "score": second.score,
                    "mean": float(second.mean),
                    "ci95": float(second.ci),
                },
                "p_value": float(second.p_value),
            }
            rows.append(
                f"| {decoding} | {metric} | {first.score:.2f} ({first.mean:.2f} ± {first.ci:.2f}) "
                f"| {second.score:.2f} ({second.mean:.2f} ± {second.ci:.2f}) | "
                f"{second.score - first.score:+.2f} | {second.p_value:.3f} |"
            )
        result["signatures"] = {m: str(sig) for m, sig in signatures.items()}
        out[decoding] = result
    command = common.command_line()
    out["command"] = command
    args.out.with_suffix(".json").write_text(json.dumps(out, indent=2, ensure_ascii=False))
    md = [
        f"# {names[0]} vs {names[1]}: paired bootstrap on the test split",
        "",
        f"sacreBLEU's paired bootstrap resampling ({args.samples} resamples of the "
        f"{len(refs)} test sentences; BLEU tokenize={tokenize}). Each cell: the score on the whole "
        "test split (bootstrap mean ± 95% half-width); p: the chance of a difference at least this "
        "large if the two systems were equally good (p > 0.05: within noise).",
        "",
        f"- {names[0]}: `python -m benchmarks.translate.train {out['commands'][0]}`",
        f"- {names[1]}: `python -m benchmarks.translate.train {out['commands'][1]}`",
        "",
        f"| decoding | metric | {names[0]} | {names[1]} | difference | p |",
        "|---|---|---|---|---:|---:|",
        *rows,
    ]
    page = common.with_command(md, command)
    args.out.with_suffix(".md").write_text(page)
    print(page)


if __name__ == "__main__":
    main()
