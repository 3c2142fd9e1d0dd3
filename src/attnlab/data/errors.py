"""The one exception type for bad input data."""

from __future__ import annotations

from os import PathLike

from attnlab.errors import UserError


class DataError(UserError):
    """Bad input data; the message names the file, the line (when known) and the fix."""

    def __init__(
        self, path: str | PathLike[str], problem: str, fix: str, line: int | None = None
    ) -> None:
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {problem}. Fix: {fix}")
        self.path = str(path)
        self.line = line
        self.problem = problem
        self.fix = fix
