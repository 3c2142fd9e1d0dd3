"""Output that cannot be written is one line and a non-zero exit, never a traceback and never
a silent success: `predict` to a full disk or a closed standard output, `embed --out` to a
folder, under a file, into a folder that takes no file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli import main

sys.path.insert(0, str(Path(__file__).parents[1] / "explore"))
import explore_runs  # noqa: E402
from _one_line import one_line  # noqa: E402  (this folder is on the path under pytest)

SRC = Path(__file__).resolve().parents[2] / "src"


def attnlab(*args: str, shell_redirect: str = "", stdout=None) -> subprocess.CompletedProcess:
    """The `attnlab` executable's code path (console: main, then the quick exit)."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "attnlab", *args]
    if shell_redirect:
        quoted = " ".join(f"'{c}'" for c in cmd)
        return subprocess.run(["bash", "-c", f"exec {quoted} {shell_redirect}"], env=env,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    return subprocess.run(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return explore_runs.classifier_run(tmp_path_factory.mktemp("out"))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_predict_to_a_full_disk_is_one_line_and_exit_2(run) -> None:
    with open("/dev/full", "w") as full:
        done = attnlab("predict", str(run), "好", "差", stdout=full)
    assert done.returncode == 2
    one_line(done.stderr, "cannot write the predictions", "No space left on device")


def test_predict_with_standard_output_closed_is_refused(run) -> None:
    done = attnlab("predict", str(run), "好", shell_redirect=">&-")
    assert done.returncode == 2
    one_line(done.stderr, "standard output is closed")


def test_embed_out_that_cannot_be_written_is_one_line_before_the_encoder(
    tmp_path, capsys, monkeypatch
) -> None:
    import attnlab.infer.embeddings as embeddings

    folder = tmp_path / "vectors.npy"
    folder.mkdir()
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    cases = {
        str(folder): "is a folder",
        str(a_file / "v.npy"): "is a file, not a folder",
        str(tmp_path / "v.txt"): "must end in .npy or .json",
    }
    for pseudo in ("/sys", "/proc"):  # folders that take no file, even for root (EACCES, ENOENT)
        if not _writable(pseudo):
            cases[f"{pseudo}/v.npy"] = f"cannot write --out {pseudo}/v.npy"
    real = embeddings.SentenceEncoder.load

    def never(*args, **kwargs):
        raise AssertionError("the encoder was loaded before --out was known to be writable")

    monkeypatch.setattr(embeddings.SentenceEncoder, "load", never)
    for out, needle in cases.items():
        capsys.readouterr()
        assert main(["embed", "好", "--arch", "minilm", "--out", out]) == 2
        one_line(capsys.readouterr().err, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "vectors.npy"]
    monkeypatch.setattr(embeddings.SentenceEncoder, "load", real)
    deep = tmp_path / "new" / "folder" / "v.npy"  # a missing folder is made
    assert main(["embed", "好", "--arch", "minilm", "--out", str(deep)]) == 0
    assert [p.name for p in deep.parent.iterdir()] == ["v.npy"]  # no temporary file left


def _writable(folder: str) -> bool:
    try:
        probe = Path(folder) / f".attnlab-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
        return True
    except OSError:
        return False
