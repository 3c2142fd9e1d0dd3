"""`LabeledCorpus`: texts with string labels, where they came from, and how they were cleaned."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from attnlab.errors import UserError


@dataclass
class LabeledCorpus:
    """Parallel lists of texts and string labels, plus their source and cleaning statistics.

    `origins`, when known, gives "file:line" for each example so later checks can point at it.
    """

    texts: list[str]
    labels: list[str]
    source: str
    stats: dict[str, Any] = field(default_factory=dict)
    origins: list[str] | None = None

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels):
            raise UserError(
                f"{self.source}: {len(self.texts)} texts but {len(self.labels)} labels; "
                "texts and labels must be parallel lists"
            )
        if self.origins is not None and len(self.origins) != len(self.texts):
            raise UserError(
                f"{self.source}: {len(self.origins)} origins for {len(self.texts)} texts; "
                "give one 'file:line' per text or none"
            )

    def __len__(self) -> int:
        return len(self.texts)

    def label_counts(self) -> dict[str, int]:
        """Examples per label, labels sorted."""
        return dict(sorted(Counter(self.labels).items()))
