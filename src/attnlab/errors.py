"""The one exception type for bad user input.

A :class:`UserError` is raised at an input boundary (a command-line value, a file, a run folder)
with a message that names the problem and the fix; the command line prints it as one line and
exits 2. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user: one line naming the problem and what to do instead."""
