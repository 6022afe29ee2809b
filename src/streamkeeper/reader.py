"""Read target tables, optionally as of one checkpoint (a commit marker)."""

from __future__ import annotations

from typing import Any

from streamkeeper.storage import Location


def read_table_rows(
    uri: str, *, version: int | None = None, location: Location | None = None
) -> list[dict[str, Any]]:
    """All rows of a Delta table (at `version` if given), as dictionaries."""
    from deltalake import DeltaTable

    options = (location or Location(uri)).storage_options()
    table = DeltaTable(uri, version=version, storage_options=options)
    # to_pyarrow_table() can abort the process at exit (delta-rs#2184); the dataset does not.
    return table.to_pyarrow_dataset().to_table(use_threads=False).to_pylist()


def read_as_of_checkpoint(
    store_root: Location, lineage: str, seq: int | None = None
) -> dict[str, Any] | None:
    """The commit marker for `seq` (the latest if None): batch id and each table's version.

    None if there is none: markers older than `maintenance.history_retention`, beyond the
    newest 1 000 and of no retained checkpoint or savepoint are retired (PROTOCOL.md).
    """
    from streamkeeper.lineage.layout import LineageLayout

    layout = LineageLayout(store_root, lineage, job=lineage)
    store = store_root.store()
    if seq is None:
        keys = store.list(layout.markers)
        return store.read_json(keys[-1]) if keys else None
    return store.read_json(layout.marker(seq))
