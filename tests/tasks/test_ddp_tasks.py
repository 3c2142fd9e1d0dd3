"""Every task under torchrun with two CPU ranks: rank 0 alone writes the run directory (and
prints), the other rank prepares its data in a private scratch folder, and the result loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from attnlab.runs import load_run

pytestmark = pytest.mark.slow
ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TRAIN = ["--tensorboard", "false", "--precision", "fp32", "--max-steps", "2", "--eval-every", "2"]
SMALL = ["--d-model", "16", "--n-heads", "2", "--d-ff", "32"]


def torchrun(args: list[str], cwd: Path) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    out = subprocess.run(
        [*cmd, "-m", "attnlab", "train", *args],
        cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


def data_files(root: Path) -> dict[str, Path]:
    """A labelled CSV, a text file and an image folder, all tiny."""
    rows = ["text,label"] + [f"{'喜乐好' if i % 2 else '怒坏差'}的{i},{'a' if i % 2 else 'b'}"
                             for i in range(80)]  # fmt: skip
    (root / "reviews.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (root / "text.txt").write_text("to be or not to be, that is the question.\n" * 60)
    for cls, value in (("dark", 0), ("light", 255)):
        (root / "imgs" / cls).mkdir(parents=True)
        for k in range(16):
            Image.new("L", (8, 8), value ^ k).save(root / "imgs" / cls / f"{k}.png")
    return {
        "csv": root / "reviews.csv",
        "txt": root / "text.txt",
        "imgs": root / "imgs",
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return data_files(tmp_path_factory.mktemp("ddpdata"))


CASES = {
    "classify": lambda f: ["--arch", "char", "--extra-train", "", "--data", str(f["csv"]),
                           *SMALL, "--n-layers", "1",
                           "--ngram-buckets", "64", "--min-freq", "1", "--batch-size", "8"],
    "lm": lambda f: ["--data", str(f["txt"]), *SMALL, "--n-layers", "1", "--context", "16",
                     "--eval-windows", "4", "--sample-tokens", "4", "--batch-size", "4"],
    "translate": lambda f: ["--config", "copy", "--synthetic-size", "600", *SMALL,
                            "--n-encoder-layers", "1", "--n-decoder-layers", "1"],
    "vision": lambda f: ["--dataset", "folder", "--data", str(f["imgs"]), "--channels", "1",
                         "--val-ratio", "0.2", "--test-ratio", "0.2", "--batch-size", "4",
                         "--patch-size", "4", *SMALL, "--n-layers", "1", "--max-minutes", "0"],
    "mlm": lambda f: ["--data", str(f["txt"]), *SMALL, "--n-layers", "1", "--vocab-size", "60",
                      "--min-frequency", "1", "--max-len", "12", "--batch-size", "8"],
}  # fmt: skip


@pytest.mark.parametrize("task", sorted(CASES))
def test_rank_zero_alone_writes_the_run(task: str, files, tmp_path: Path) -> None:
    out = tmp_path / "runs" / task
    log = torchrun([task, "--out", str(out), *TRAIN, *CASES[task](files)], tmp_path)
    assert log.count("run directory:") == 1, log[-2000:]  # rank 0 alone prints
    assert log.count("[attnlab] precision") == 1
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [task]  # no staging left
    assert not (out / ".lock").read_text()  # released
    run = load_run(out)
    assert run.task == task and (out / "results.json").is_file()
    assert (out / "config.json").is_file() and (out / "state" / "COMPLETE").is_file()
