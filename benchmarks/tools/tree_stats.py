"""The shape of the source tree at some revisions: lines and files under src/, top-level modules,
modules named run*, the files a new model needs, `duplicates` pairs and `attnlab --help` time.

    python -m benchmarks.tools.tree_stats REV [REV ...] [--rounds 10]
        -> docs/results/tree_stats.{json,md}

Each revision is exported with `git archive` into a temporary folder and measured there, the
same way for every revision. The --help rounds alternate between the revisions (a fresh Python
per run, with PYTHONPATH on that copy's src/), so the machine's load falls on all of them alike;
besides the wall time, `python -X importtime` gives the cumulative import time of attnlab.cli
and says whether torch was imported. "Files a new model needs": a throwaway model module (one
feed-forward layer, registered with no oracle) is written into the copy's models/, and the
registry's own tests (`tests/models/test_registry.py -k PROBE`) must pass with no other file
edited. `duplicates` (a command of this workplace) is run where it is on PATH.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

PROBE = "toy_probe"
PROBE_MODULE = '''"""A throwaway model: tokens through one feed-forward layer (tree_stats)."""

from dataclasses import dataclass

from torch import nn

from attnlab.configs import ConfigBase, setting
from {blocks} import FeedForward
from attnlab.models.registry import register_model, tokens


@dataclass
class ProbeConfig(ConfigBase):
    vocab_size: int = setting(100, min=1)
    d_model: int = setting(16, min=1)


@register_model("{name}", family="probe", config=ProbeConfig, oracle=None, example=tokens(),
                tiny={{"vocab_size": 20, "d_model": 8}}, note="no oracle: a measurement probe")
class ProbeModel(nn.Module):
    def __init__(self, cfg: ProbeConfig) -> None:
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.ff = FeedForward(cfg.d_model, 2 * cfg.d_model)

    def forward(self, ids):
        return self.ff(self.emb(ids)).mean(1)
'''


def export(rev: str, into: Path) -> str:
    """``rev``'s tracked files under ``into``; returns its short commit."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", rev], capture_output=True, text=True, check=True,
        cwd=common.ROOT,
    ).stdout.strip()  # fmt: skip
    archive = subprocess.run(["git", "archive", rev], capture_output=True, check=True,
                             cwd=common.ROOT)  # fmt: skip
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return commit


def shape(tree: Path) -> dict:
    pkg = tree / "src" / "attnlab"
    files = sorted((tree / "src").rglob("*.py"))
    return {
        "src_py_lines": sum(len(p.read_text(encoding="utf-8").splitlines()) for p in files),
        "src_py_files": len(files),
        "top_level_modules": len(list(pkg.glob("*.py"))),
        "packages": sorted(p.parent.name for p in pkg.glob("*/__init__.py")),
        "modules_named_run": sorted(str(p.relative_to(pkg)) for p in pkg.rglob("run*.py")),
    }


def help_round(tree: Path) -> tuple[float, int, bool]:
    """(wall seconds of `attnlab --help`, attnlab.cli's cumulative import µs, torch imported)."""
    env = {"PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "attnlab", "--help"], env=env, capture_output=True,
                   check=True)  # fmt: skip
    wall = time.perf_counter() - start
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "attnlab", "--help"],
                         env=env, capture_output=True, text=True, check=True).stderr  # fmt: skip
    cli = next(int(ln.split("|")[1]) for ln in out.splitlines() if ln.endswith("| attnlab.cli"))
    torch = any(ln.split("|")[-1].strip() == "torch" for ln in out.splitlines())
    return wall, cli, torch


def files_for_a_model(tree: Path) -> dict:
    """Write the probe model (one file) and run the registry's tests on it."""
    pkg = tree / "src" / "attnlab"
    layers = (pkg / "layers" / "blocks.py").exists()
    blocks = "attnlab.layers.blocks" if layers else "attnlab.blocks"
    (pkg / "models" / f"{PROBE}.py").write_text(PROBE_MODULE.format(blocks=blocks, name=PROBE))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", PROBE,
         f"--basetemp={tree / '.pytest-tmp'}", "tests/models/test_registry.py"],
        cwd=tree, env={"PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1",
                       "PATH": "/usr/bin:/bin", "HOME": str(tree)},
        capture_output=True, text=True,
    )  # fmt: skip
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-200:]
    return {"files_written": 1, "registry_tests": summary, "passed": out.returncode == 0}


def duplicate_pairs(tree: Path) -> str:
    tool = shutil.which("duplicates")
    if tool is None:
        return "duplicates not on PATH"
    out = subprocess.run([tool, "--repo", str(tree), "--most", "1", "--seconds", "300"],
                         capture_output=True, text=True).stdout  # fmt: skip
    first = out.splitlines()[0] if out else ""
    m = re.match(r"(\d+) pairs of places \((\d+) files read\)", first)
    return f"{m[1]} pairs ({m[2]} files read)" if m else first


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="+", help="git revisions to measure (e.g. a39a96e HEAD)")
    parser.add_argument("--rounds", type=int, default=10, help="--help runs per revision")
    args = parser.parse_args(argv)
    info = common.machine(threads=1)
    work = Path(tempfile.mkdtemp(prefix="tree_stats-"))
    try:
        trees = {rev: work / f"rev{i}" for i, rev in enumerate(args.revs)}
        rows = {rev: {"commit": export(rev, tree), **shape(tree)} for rev, tree in trees.items()}
        for rev, tree in trees.items():
            rows[rev]["duplicates"] = duplicate_pairs(tree)
        timings: dict[str, list[tuple[float, int, bool]]] = {rev: [] for rev in trees}
        for _ in range(args.rounds):
            for rev, tree in trees.items():
                timings[rev].append(help_round(tree))
        for rev, runs in timings.items():
            rows[rev]["help_median_s"] = statistics.median(r[0] for r in runs)
            rows[rev]["help_min_s"] = min(r[0] for r in runs)
            rows[rev]["cli_import_median_ms"] = statistics.median(r[1] for r in runs) / 1000
            rows[rev]["help_imports_torch"] = any(r[2] for r in runs)
        for rev, tree in trees.items():
            rows[rev]["new_model"] = files_for_a_model(tree)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta = {**info, "rounds": args.rounds, "load_average_at_end": common.load_average()}
    revs = list(rows)

    def line(label: str, fmt) -> str:
        return f"| {label} | " + " | ".join(fmt(rows[r]) for r in revs) + " |"

    lines = [
        "# The source tree at each revision (`benchmarks/tools/tree_stats.py`)",
        "",
        common.machine_line(meta),
        f"`attnlab --help`: {args.rounds} rounds, alternating between the revisions.",
        "",
        "| | " + " | ".join(f"{r} ({rows[r]['commit']})" for r in revs) + " |",
        "|---|" + "---|" * len(revs),
        line("lines of src/**/*.py", lambda x: f"{x['src_py_lines']:,}"),
        line("files src/**/*.py", lambda x: str(x["src_py_files"])),
        line("top-level modules of src/attnlab", lambda x: str(x["top_level_modules"])),
        line(
            "packages of src/attnlab",
            lambda x: f"{len(x['packages'])}: " + ", ".join(x["packages"]),
        ),  # fmt: skip
        line("modules named run*", lambda x: ", ".join(x["modules_named_run"]) or "none"),
        line(
            "files a new model needs (registry tests)",
            lambda x: (
                f"{x['new_model']['files_written']} ({x['new_model']['registry_tests']})"
                if x["new_model"]["passed"]
                else f"failed: {x['new_model']['registry_tests']}"
            ),
        ),
        line("`duplicates` pairs", lambda x: x["duplicates"]),
        line(
            "`attnlab --help` median (min)",
            lambda x: f"{x['help_median_s']:.3f} s ({x['help_min_s']:.3f} s)",
        ),  # fmt: skip
        line("import of attnlab.cli, median", lambda x: f"{x['cli_import_median_ms']:.1f} ms"),
        line("`--help` imports torch", lambda x: "yes" if x["help_imports_torch"] else "no"),
    ]
    common.write_results("tree_stats", {"meta": meta, "rows": rows}, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
