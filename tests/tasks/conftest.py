"""Make the helpers of these tests (`_cli`) importable whatever pytest's import mode; the
tiny classifier run the misuse probes share."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _cli import train, write_corpus  # noqa: E402  (importable once HERE is on the path)


@pytest.fixture(scope="module")
def classify_run(tmp_path_factory) -> Path:
    """A finished tiny character-model run, one per test module (the tests copy it)."""
    root = tmp_path_factory.mktemp("run")
    assert train(root / "run", write_corpus(root / "tiny.csv"), "--max-steps", "4") == 0
    return root / "run"
