"""How much of an input the model can read: the share of its tokens that became ``<unk>``.

A character the training texts never held (or held fewer than ``min_freq`` times) reaches the
model as ``<unk>``; so does a WordPiece word that no piece of the vocabulary spells. A label
predicted for a text made mostly of such tokens is a guess, however confident its probability
looks, so ``attnlab predict`` and the explorer report the share and flag inputs above
:data:`UNKNOWN_SHARE_LIMIT`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

# Above this share of <unk> tokens an input is flagged as out of the model's reach.
UNKNOWN_SHARE_LIMIT = 0.3


def unknown_share(ids: Sequence[int], unk_id: int, specials: Collection[int] = ()) -> float:
    """Share of the text's tokens (``specials`` such as <cls>/[SEP] left out) that are <unk>."""
    text_ids = [i for i in ids if i not in specials]
    if not text_ids:
        return 0.0
    return sum(i == unk_id for i in text_ids) / len(text_ids)


def reach(
    ids: Sequence[int], unk_id: int, specials: Collection[int] = (), unit: str = "characters"
) -> dict[str, Any]:
    """The fields a prediction carries: ``unknown_share``, ``out_of_reach`` (over the limit)
    and, when it is, a one-line ``warning`` that names the share of unknown ``unit``."""
    share = unknown_share(ids, unk_id, specials)
    fields: dict[str, Any] = {
        "unknown_share": round(share, 4),
        "out_of_reach": share > UNKNOWN_SHARE_LIMIT,
    }
    if fields["out_of_reach"]:
        fields["warning"] = (
            f"{share:.0%} of its {unit} were never (or rarely) seen in training, over the "
            f"{UNKNOWN_SHARE_LIMIT:.0%} limit: the label is a guess"
        )
    return fields
