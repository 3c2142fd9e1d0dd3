"""Make the tiny task helper importable as `_tiny_task` whatever pytest's import mode; keep
precision="auto"'s record of step timings private to each test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(autouse=True)
def precision_record_file(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> Path:
    """precision="auto" records its step timings in attnlab's data cache; the engine tests keep
    theirs in a folder of their own, so a test neither reads nor leaves a user's record."""
    from attnlab.train import precision_record

    folder = tmp_path_factory.mktemp("precision_record")
    monkeypatch.setattr(precision_record, "data_dir", lambda: folder)
    return folder / precision_record.RECORD_FILE
