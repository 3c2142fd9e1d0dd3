"""Make the task tests' helpers (`_cli`) importable when these tests run on their own."""

from __future__ import annotations

import sys
from pathlib import Path

TASKS = Path(__file__).resolve().parents[1] / "tasks"
if str(TASKS) not in sys.path:
    sys.path.insert(0, str(TASKS))
