"""Scoring a 100,000-row file with `attnlab predict RUN --data FILE --out OUT`, end to end.

    python -m benchmarks.infer.score_file RUN [--rows 100000] [--kill-after 60]
        -> docs/results/score_file.{json,md}

The file is the bundled Chinese reviews (17,363) repeated in corpus order until ``--rows``
rows, written as a CSV with an ``id`` and a ``stars`` column beside ``review``. The command
runs as a user runs it (its own process, its default path: ``--precision auto --threads auto``
for a file). With ``--kill-after S`` the first run is SIGKILLed after S seconds and a second
run with ``--resume`` finishes the file; the page then checks that the output has every row
once, in order. Texts/s is rows over the seconds
the scoring took (load and the path's measurement excluded; both are given).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    RESULTS,
    ROOT,
    command_line,
    load_average,
    machine,
    machine_line,
    write_page,
)

STEM = "score_file"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a trained classifier run folder")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--kill-after", type=float, default=0.0,
                   help="SIGKILL the first run after this many seconds, then --resume")  # fmt: skip
    p.add_argument("--out", default=STEM, help="results stem under docs/results/")
    return p


def write_reviews(path: Path, rows: int) -> None:
    from attnlab.data.sentiment import BUNDLED, read_corpus

    corpus = read_corpus(BUNDLED)
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["id", "review", "stars"])
        for i in range(rows):
            j = i % len(corpus.texts)
            w.writerow([i, corpus.texts[j], 5 if corpus.labels[j] == "positive" else 1])


def predict(run: str, data: Path, out: Path, resume: bool, kill_after: float) -> dict:
    """One `attnlab predict --data` process: its wall time, its stderr, its summary line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "attnlab", "predict", run, "--data", str(data), "--text-col",
           "review", "--out", str(out), *(["--resume"] if resume else [])]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    if kill_after:
        try:
            proc.wait(kill_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - start
    path = next((line for line in stderr.splitlines() if line.startswith("predict: ")), "")
    return {"seconds": wall, "returncode": proc.returncode, "summary": stdout.strip(),
            "path": path}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    info = machine()
    result: dict = {"command": command_line(argv), "machine": info, "run": args.run,
                    "rows": args.rows}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        data, out = Path(tmp) / "reviews.csv", Path(tmp) / "scored.csv"
        write_reviews(data, args.rows)
        runs = []
        if args.kill_after:
            runs.append(predict(args.run, data, out, False, args.kill_after))
        runs.append(predict(args.run, data, out, bool(args.kill_after), 0.0))
        for r in runs:
            print(r, flush=True)
        with open(out, encoding="utf-8", newline="") as f:
            ids = [row["id"] for row in csv.DictReader(f)]
        result["output_rows"] = len(ids)
        result["ids_in_order_once"] = ids == [str(i) for i in range(args.rows)]
    result["runs"] = runs
    last = runs[-1]
    found = re.search(r"scored (\d+) of (\d+) rows.* in ([\d.]+) s \(([\d.]+) texts/s\)",
                      last["summary"])  # fmt: skip
    if found is None:
        raise SystemExit(f"no summary line in the predict run: {last}")
    result["scored"], result["scoring_seconds"] = int(found.group(1)), float(found.group(3))
    result["texts_per_s"] = float(found.group(4))
    kept = re.search(r"\((\d+) were in it already\)", last["summary"])
    result["resumed"] = int(kept.group(1)) if kept else 0
    info["load_average_at_end"] = load_average()
    (RESULTS / f"{args.out}.json").write_text(
        json.dumps(result, indent=1, ensure_ascii=False) + "\n"
    )
    write_page(RESULTS / f"{args.out}.md", render(result), result["command"])
    print(render(result))


def render(r: dict) -> str:
    last = r["runs"][-1]
    lines = [
        f"# Scoring a {r['rows']:,}-row CSV with `attnlab predict --data`",
        "",
        machine_line(r["machine"]),
        "",
        f"Run: `{r['run']}`. The file: the bundled reviews (17,363) repeated in order to "
        f"{r['rows']:,} rows, columns id, review, stars. Other work shared the two cores.",
        "",
        f"- path: {last['path'] or '(not said)'}",
        f"- scored {r['scored']:,} rows in {r['scoring_seconds']:.0f} s: "
        f"**{r['texts_per_s']:.1f} texts/s** (the process took {last['seconds']:.0f} s "
        "with loading and the path's measurement)",
    ]
    if len(r["runs"]) > 1:
        first = r["runs"][0]
        lines.append(
            f"- the first run was killed (SIGKILL) after {first['seconds']:.0f} s with "
            f"{r['resumed']:,} whole rows in OUT; `--resume` scored the other "
            f"{r['scored']:,}"
        )
    lines.append(
        f"- OUT holds {r['output_rows']:,} rows; every id once and in order: "
        f"{'yes' if r['ids_in_order_once'] else 'NO'}"
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
