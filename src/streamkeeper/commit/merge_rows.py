"""One row per key for a merge sink: duplicates found, or the greatest `order_by` kept.

Pure pyarrow, so executors (one staged file each) and the driver (across files, and at
commit time) apply the same rule. A null key is one key, as in a GROUP BY; a null (or
NaN) `order_by` loses to any value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from streamkeeper.errors import DuplicateKeyError

if TYPE_CHECKING:
    import pyarrow as pa

_ROW = "__streamkeeper_row"
EXAMPLES = 5  # duplicate keys named in an error


def unique_columns(key: Sequence[str], order_by: str | None) -> list[str]:
    """The columns no two rows of a batch may share: the key, and `order_by` if given."""
    return [*key, order_by] if order_by else list(key)


def find_duplicate_keys(
    table: pa.Table, key: Sequence[str], limit: int = EXAMPLES
) -> list[dict[str, Any]]:
    """Up to `limit` values of the `key` columns that more than one row of `table` holds."""
    import pyarrow.compute as pc

    if table.num_rows < 2:
        return []
    counts = table.select(list(key)).group_by(list(key), use_threads=False)
    counted = counts.aggregate([([], "count_all")])
    repeated = counted.filter(pc.greater(counted.column("count_all"), 1))
    return repeated.select(list(key)).slice(0, limit).to_pylist()


def duplicate_key_error(
    sink: str, key: Sequence[str], order_by: str | None, duplicates: list[dict[str, Any]]
) -> DuplicateKeyError:
    """The error naming the sink, the repeated key values and the fix."""
    shown = "; ".join(", ".join(f"{c}={v!r}" for c, v in d.items()) for d in duplicates)
    if order_by is None:
        return DuplicateKeyError(
            f"merge sink {sink!r} got more than one row for a key in one batch ({shown}), "
            f"so which row wins is undefined. Add order_by: <column> to sink {sink!r} (the row "
            "with the greatest value wins), or make the transformation emit one row per "
            f"key {list(key)}"
        )
    return DuplicateKeyError(
        f"merge sink {sink!r} got more than one row with the same key and the same "
        f"order_by {order_by!r} value in one batch ({shown}), so which row wins is "
        f"undefined. Order by a column that differs between a key's rows (e.g. an event "
        f"time or sequence number), or make the transformation emit one row per key {list(key)}"
    )


def check_one_row_per_key(
    table: pa.Table, sink: str, key: Sequence[str], order_by: str | None
) -> None:
    """Raise unless every key (with `order_by`: every key and order value) is unique.

    Raises:
        DuplicateKeyError: naming the sink, the repeated values and the fix.
    """
    duplicates = find_duplicate_keys(table, unique_columns(key, order_by))
    if duplicates:
        raise duplicate_key_error(sink, key, order_by, duplicates)


def last_row_per_key(
    table: pa.Table, key: Sequence[str], order_by: str | None, *, sink: str = "?"
) -> pa.Table:
    """One row per key: the row with the greatest `order_by`.

    Without `order_by` every key must already be unique.

    Raises:
        DuplicateKeyError: two rows share a key (and, with `order_by`, its value).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    check_one_row_per_key(table, sink, key, order_by)
    if order_by is None or table.num_rows < 2:
        return table
    order = pc.sort_indices(table, sort_keys=[(order_by, "ascending")], null_placement="at_start")
    ordered = table.take(order)
    positions = pa.array(range(ordered.num_rows), type=pa.int64())
    last = (
        ordered.append_column(_ROW, positions)
        .group_by(list(key), use_threads=False)
        .aggregate([(_ROW, "max")])
    )
    return ordered.take(last.column(f"{_ROW}_max"))
