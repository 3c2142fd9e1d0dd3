"""Helpers of the command-line probes: a tiny corpus, tiny options, file snapshots, and
`probe` (bad input -> exit 2 and one line on stderr, no traceback)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from attnlab.cli import main

TINY = [
    "--arch", "char", "--extra-train", "",  # the character model (the default fine-tunes e5)
    "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32",
    "--ngram-buckets", "64", "--min-freq", "1", "--batch-size", "16",
    "--tensorboard", "false", "--precision", "fp32", "--num-threads", "1",
]  # fmt: skip


def write_corpus(path: Path, n: int = 120) -> Path:
    rows = ["text,label"] + [
        ("的一是喜在不了有" if i % 2 else "和人这怒中大为上")[i % 5 :]
        + f"{i},"
        + ("happy" if i % 2 else "angry")
        for i in range(n)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def snapshot(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file below ``folder``."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def probe(capsys, argv: list[str], *needles: str, after_training: bool = False) -> str:
    """Run the CLI, expect exit 2 with one line on stderr naming each needle; return it.

    ``after_training``: the failure came mid-run, so training's progress lines precede it."""
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert after_training or "\n" not in err, err
    last = err.splitlines()[-1] if err else ""
    assert "Traceback" not in err and last.startswith("attnlab: error:"), err
    for needle in needles:
        assert needle in last, (needle, last)
    return last


def train(out: Path, data: Path, *extra: str) -> int:
    return main(["train", "classify", "--out", str(out), "--data", str(data), *TINY, *extra])
