"""Make the helpers of these tests (`_cli`, `_e5`) importable whatever pytest's import mode;
the tiny classifier run the misuse probes share, and the tiny e5 stand-in."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _cli import train, write_corpus  # noqa: E402  (importable once HERE is on the path)
from _e5 import tiny_e5  # noqa: E402


@pytest.fixture(scope="module")
def classify_run(tmp_path_factory) -> Path:
    """A finished tiny character-model run, one per test module (the tests copy it)."""
    root = tmp_path_factory.mktemp("run")
    assert train(root / "run", write_corpus(root / "tiny.csv"), "--max-steps", "4") == 0
    return root / "run"


@pytest.fixture
def tiny(monkeypatch):
    """e5's registry entry lends the tiny random encoder of its layout (_e5.tiny_e5)."""
    import attnlab.models.e5 as e5

    monkeypatch.setattr(e5, "load_e5", tiny_e5)
