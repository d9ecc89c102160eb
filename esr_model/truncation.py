"""Which tokens of a text longer than the encoder's window it reads: its start, its end, or both ends."""

from __future__ import annotations

from typing import Literal

Keep = Literal["head", "tail", "ends"]


def cut_ids(ids: list[int], limit: int, keep: Keep = "head") -> list[int]:
    """At most `limit` token ids of `ids` (which start with the model's [CLS] and end with its
    [SEP]), those two kept: the first ones (head), the last ones (tail), or half of each (ends).
    A list within the limit is returned as it is: this runs on every text the batcher tokenizes."""
    if len(ids) <= limit:
        return ids
    if keep == "head":
        return ids[: limit - 1] + ids[-1:]
    if keep == "tail":
        return ids[:1] + ids[len(ids) - (limit - 1):]
    half = limit // 2
    return ids[:half] + ids[len(ids) - (limit - half):]
