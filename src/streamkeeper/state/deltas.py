"""The Delta tables of a canonical savepoint, through delta-rs (local or S3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamkeeper.state.errors import CanonicalManifestError
from streamkeeper.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable


def overwrite(location: Location, table: pa.Table) -> int:
    """Write `table` as the table's new version (replacing any earlier attempt).

    Returns:
        The bytes of the data files now in the table.
    """
    from deltalake import write_deltalake

    write_deltalake(
        location.uri,
        table,
        mode="overwrite",
        schema_mode="overwrite",
        storage_options=location.storage_options() or None,
    )
    return table_bytes(open_table(location))


def open_table(location: Location) -> DeltaTable:
    """The table; the error names the location and the fix.

    Raises:
        CanonicalManifestError: there is no Delta table there.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(location.uri, storage_options=location.storage_options() or None)
    except TableNotFoundError:
        raise CanonicalManifestError(
            f"the savepoint's state table {location.uri!r} is missing; the savepoint is "
            "incomplete or was moved: take it again"
        ) from None


def table_bytes(table: DeltaTable) -> int:
    actions = table.get_add_actions(flatten=True)
    return int(sum(actions.column("size_bytes").to_pylist())) if actions.num_rows else 0


def data_files(location: Location) -> list[str]:
    """The table's current data files, as paths for the location's Arrow file system."""
    return [_fs_path(uri) for uri in open_table(location).file_uris()]


def _fs_path(uri: str) -> str:
    """`s3://bucket/key` -> `bucket/key` (pyarrow's S3 paths); `file:///x` -> `/x`."""
    for scheme in ("s3://", "s3a://", "file://"):
        if uri.startswith(scheme):
            return uri[len(scheme) :]
    return uri


def read_table(location: Location) -> pa.Table:
    """The whole table, read on the driver (without delta-rs#2184's exit abort)."""
    return open_table(location).to_pyarrow_dataset().to_table(use_threads=False)


def commit_files(location: Location, schema: pa.Schema, files: list[tuple[str, int, str]]) -> None:
    """Make `files` (path relative to the table, size, stats JSON) the table's content.

    One commit: it creates the table, or replaces whatever an earlier attempt committed.
    """
    import time

    from deltalake import Schema
    from deltalake.transaction import AddAction, create_table_with_add_actions

    now_ms = int(time.time() * 1000)
    create_table_with_add_actions(
        location.uri,
        Schema.from_arrow(schema),
        [AddAction(path, size, {}, now_ms, True, stats) for path, size, stats in files],
        mode="overwrite",
        storage_options=location.storage_options() or None,
    )
