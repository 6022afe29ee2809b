"""The one-integer offsets our Python sources checkpoint ({"seq": N}, {"version": V})."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamkeeper.errors import SourceError


def parse_int_offset(offset: Mapping[str, Any], field: str, minimum: int, source: str) -> int:
    """The integer `field` of a checkpointed offset.

    Raises:
        SourceError: the offset was written by another source (names it and the fix).
    """
    value = offset.get(field) if isinstance(offset, Mapping) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise SourceError(
            f"offset {offset!r} is not a {source} offset {{'{field}': N}}; the checkpoint was "
            "written by another source: point checkpoint.dir at a new directory"
        )
    return value
