"""Reading a run's ``tokenizer.json`` on a second thread while this one imports torch.

The e5 classifier's tokenizer is a 250,000-piece unigram model in a 17 MB JSON file: the
``tokenizers`` library takes over a second to build it, and it does so without holding
Python's lock, so on a machine of two cores that second passes beside torch's own 1.7-second
import instead of after it. The command line starts it for the verbs that load a run
(:func:`start`); the tokenizer's loader takes the result (:func:`take`) and reads the file
itself when nothing was started, the file changed since, or the early read failed (its own
read then reports the problem). Nothing else changes: the object is the one
``Tokenizer.from_file`` returns.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

_pending: dict[str, tuple[threading.Thread, dict[str, Any], tuple[int, int]]] = {}


def _key(path: str | Path) -> tuple[str, tuple[int, int]] | None:
    """(absolute path, (size, mtime_ns)) of a regular file, else None."""
    try:
        stat = os.stat(path)
    except (OSError, ValueError):
        return None
    if not os.path.isfile(path):
        return None
    return os.path.abspath(path), (stat.st_size, stat.st_mtime_ns)


def start(path: str | Path) -> None:
    """Begin reading the tokenizer file ``path`` on a daemon thread (nothing when absent)."""
    key = _key(path)
    if key is None or key[0] in _pending:
        return
    box: dict[str, Any] = {}

    def read() -> None:
        try:
            from tokenizers import Tokenizer

            box["tokenizer"] = Tokenizer.from_file(key[0])
        except Exception:  # not a tokenizers file (a character run's) or damaged: see take()
            pass

    thread = threading.Thread(target=read, name="attnlab-tokenizer", daemon=True)
    thread.start()
    _pending[key[0]] = (thread, box, key[1])


def take(path: str | Path) -> Any:
    """The ``tokenizers.Tokenizer`` read early for ``path``, once; None when none was started,
    the read failed, or the file is not the one that was read."""
    key = _key(path)
    if key is None or key[0] not in _pending:
        return None
    thread, box, stat = _pending.pop(key[0])
    thread.join()
    return box.get("tokenizer") if stat == key[1] else None


# the verbs whose first positional argument is a run folder that holds its tokenizer.json
RUN_VERBS = ("predict", "eval", "attention")


def start_for(argv: list[str]) -> None:
    """:func:`start` on ``RUN/tokenizer.json`` for ``attnlab VERB RUN ...``; nothing for other
    command lines (an option before RUN only means nothing is read early)."""
    if len(argv) >= 2 and argv[0] in RUN_VERBS and not argv[1].startswith("-"):
        start(Path(argv[1]) / "tokenizer.json")
