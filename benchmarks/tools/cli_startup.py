"""Wall time of `attnlab --help`, `attnlab train --help` and `attnlab train lm --help`, and
whether each imports torch (a fresh interpreter per run, median of --rounds).

    python -m benchmarks.tools.cli_startup [--rounds 5]   -> docs/results/cli_startup.{json,md}
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

COMMANDS = (["--help"], ["train", "--help"], ["train", "lm", "--help"])
PROBE = (
    "import sys\nfrom attnlab.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n"
    "    pass\nprint('torch' in sys.modules, file=sys.stderr)"
)


def measure(argv: list[str], rounds: int) -> dict:
    times, torch_loaded = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True
        )
        times.append(time.perf_counter() - start)
        torch_loaded = out.stderr.strip().splitlines()[-1] == "True"
    return {"command": "attnlab " + " ".join(argv), "median_s": statistics.median(times),
            "min_s": min(times), "max_s": max(times), "imports_torch": torch_loaded}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    info = common.machine(threads=1)
    load_start = info["load_average_at_start"][0]
    rows = [measure(argv, args.rounds) for argv in COMMANDS]
    meta = {
        **info,
        "rounds": args.rounds,
        "load_average_at_end": common.load_average(),
    }
    out = Path("docs/results")
    (out / "cli_startup.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [
        "# Start-up time of the `attnlab` command (`benchmarks/tools/cli_startup.py`)",
        "",
        f"A fresh Python per run, median of {args.rounds}; {meta['logical_cores']} logical cores, "
        "load "
        f"average {load_start:.1f} at start, {meta['load_average_at_end'][0]:.1f} at end.",
        "",
        "| command | median | min–max | imports torch |",
        "|---|---|---|---|",
        *(
            f"| `{r['command']}` | {r['median_s']:.2f} s | {r['min_s']:.2f}–{r['max_s']:.2f} s | "
            f"{'yes' if r['imports_torch'] else 'no'} |"
            for r in rows
        ),  # fmt: skip
    ]
    common.write_page((out / "cli_startup.md"), lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
