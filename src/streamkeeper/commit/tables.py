"""Target Delta tables: create or check them, and commit one batch to one table.

Every commit carries two app transactions: (data app id, commit seq) makes it
idempotent, (fence app id, runner epoch) fences older runners of the lineage. Both are
checked on the very snapshot the commit is made from, because delta-rs accepts a
commit whose app transaction version is not above the table's current one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from streamkeeper.commit.merge_rows import last_row_per_key
from streamkeeper.errors import FencedError, SchemaMismatchError, StreamkeeperError
from streamkeeper.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

    from streamkeeper.commit.wal import DataFile, SinkBatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableTarget:
    """One target table and the app ids its commits carry."""

    sink: str
    location: Location
    data_app_id: str
    fence_app_id: str

    def open(self) -> DeltaTable:
        from deltalake import DeltaTable

        return DeltaTable(self.location.uri, storage_options=self.location.storage_options())

    def committed_seq(self) -> int:
        """The highest commit sequence this lineage committed to the table (-1 if none)."""
        version = self.open().transaction_version(self.data_app_id)
        return -1 if version is None else version


def ensure_table(target: TableTarget, schema: pa.Schema) -> None:
    """Create the table with `schema`, or check that an existing one matches it.

    Raises:
        SchemaMismatchError: naming the columns that differ; nothing is written.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    options = target.location.storage_options()
    try:
        table = DeltaTable(target.location.uri, storage_options=options)
    except TableNotFoundError:
        DeltaTable.create(target.location.uri, schema=schema, storage_options=options)
        return
    actual = {f.name: _type_name(f.type) for f in table.schema().fields}
    wanted = _delta_types(schema)
    if actual != wanted:
        differences = sorted(
            f"{name}: table has {actual.get(name, 'no such column')}, "
            f"job writes {wanted.get(name, 'no such column')}"
            for name in set(actual) | set(wanted)
            if actual.get(name) != wanted.get(name)
        )
        raise SchemaMismatchError(
            f"table {target.location.uri!r} (sink {target.sink!r}) does not match the job's "
            f"output: {'; '.join(differences)}. Point the sink at a new table, or migrate "
            "the table's schema first"
        )


def _delta_types(schema: pa.Schema) -> dict[str, str]:
    from deltalake import Schema

    return {f.name: _type_name(f.type) for f in Schema.from_arrow(schema).fields}


def _type_name(delta_type: object) -> str:
    """'string' rather than 'PrimitiveType("string")' in messages."""
    return str(getattr(delta_type, "type", delta_type))


def _is_retryable(error: BaseException) -> bool:
    return not isinstance(error, StreamkeeperError)


class TableCommitter:
    """Commits one sink's part of a batch to its table, exactly once."""

    def __init__(self, target: TableTarget, epoch: int, attempts: int = 5) -> None:
        self.target = target
        self.epoch = epoch
        self.attempts = attempts
        self._table: DeltaTable | None = None

    def snapshot(self) -> DeltaTable:
        """The table at its latest version; reads only the commits since the last call."""
        if self._table is None:
            self._table = self.target.open()
        else:
            self._table.update_incremental()
        return self._table

    def commit(self, part: SinkBatch, seq: int) -> int:
        """Commit `part` as commit `seq`; a no-op if the table already holds it.

        Returns:
            The table version that holds commit `seq`.

        Raises:
            FencedError: a newer runner of the lineage has committed to this table.
        """
        retrying = Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=0.2, max=5),
            retry=retry_if_exception(_is_retryable),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                return self._commit_once(part, seq)
        raise AssertionError("unreachable")  # pragma: no cover

    def _commit_once(self, part: SinkBatch, seq: int) -> int:
        table = self.snapshot()
        if part.mode != "at_least_once":
            self._check_fence(table)
            done = table.transaction_version(self.target.data_app_id)
            if done is not None and done >= seq:
                # Already committed: by us before a crash, or a commit whose response was lost.
                return table.version()
        if not part.files:
            return table.version()
        if part.output == "merge":
            self._merge(table, part, seq)
        else:
            self._append(table, part, seq)
        return self.snapshot().version()

    def _check_fence(self, table: DeltaTable) -> None:
        holder = table.transaction_version(self.target.fence_app_id)
        if holder is not None and holder > self.epoch:
            raise FencedError(
                f"runner epoch {self.epoch} of app {self.target.fence_app_id!r} is fenced: "
                f"epoch {holder} committed to {self.target.location.uri!r}. Another runner of "
                "this lineage took over; stop this one (its uncommitted batches are replayed)"
            )

    def _transactions(self, seq: int) -> list:
        from deltalake import Transaction

        return [
            Transaction(app_id=self.target.data_app_id, version=seq),
            Transaction(app_id=self.target.fence_app_id, version=self.epoch),
        ]

    def _commit_properties(self, part: SinkBatch, seq: int):  # noqa: ANN202 - deltalake type
        from deltalake import CommitProperties

        if part.mode == "at_least_once":
            return CommitProperties(custom_metadata={"streamkeeper.seq": str(seq)})
        return CommitProperties(
            app_transactions=self._transactions(seq),
            custom_metadata={"streamkeeper.seq": str(seq)},
            max_commit_retries=0,
        )

    def _append(self, table: DeltaTable, part: SinkBatch, seq: int) -> None:
        from deltalake.transaction import AddAction

        now_ms = int(time.time() * 1000)
        actions = [AddAction(f.path, f.size, {}, now_ms, True, f.stats) for f in part.files]
        table.create_write_transaction(
            actions,
            mode="append",
            schema=table.schema(),
            commit_properties=self._commit_properties(part, seq),
        )

    def _merge(self, table: DeltaTable, part: SinkBatch, seq: int) -> None:
        rows = read_staged_rows(part, self.target.location, sink=self.target.sink)
        # A null key is one key, as in a GROUP BY: `=` would insert it again every batch.
        predicate = " AND ".join(f"t.{k} IS NOT DISTINCT FROM s.{k}" for k in part.key)
        (
            table.merge(
                rows,
                predicate=predicate,
                source_alias="s",
                target_alias="t",
                commit_properties=self._commit_properties(part, seq),
            )
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )


def read_staged_rows(part: SinkBatch, like: Location, sink: str = "?") -> pa.Table:
    """The buffered merge rows of a batch: one row per key, the greatest `order_by` winning.

    Raises:
        DuplicateKeyError: two rows share a key (and `order_by` value). The batch already
            refused that before its manifest was written, so only an older manifest can.
    """
    rows = read_staged_files(part.files, like)
    return last_row_per_key(rows, part.key, part.order_by, sink=sink)


def read_staged_files(
    files: list[DataFile], like: Location, columns: list[str] | None = None
) -> pa.Table:
    """Staged merge files (absolute paths on `like`'s file system) as one table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    filesystem = like.arrow_filesystem()
    tables = []
    for data_file in files:
        path = data_file.path.removeprefix("s3://") if like.is_s3 else data_file.path
        tables.append(
            pq.read_table(path, columns=columns, filesystem=filesystem, use_threads=False)
        )
    return pa.concat_tables(tables)
