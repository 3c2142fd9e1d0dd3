"""The check the commands' misuse tests share: a refusal is one line, no traceback."""

from __future__ import annotations


def one_line(err: str, *needles: str) -> None:
    """``err`` is one ``attnlab: error:`` line naming each of ``needles``."""
    err = err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("attnlab: error:"), err
    for needle in needles:
        assert needle in err, (needle, err)
