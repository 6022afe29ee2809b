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

from streamkeeper import injection
from streamkeeper.commit.merge_rows import last_row_per_key
from streamkeeper.errors import FencedError, SchemaMismatchError, SpecError, StreamkeeperError
from streamkeeper.storage import Location
from streamkeeper.storage.parquet import open_parquet_whole

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

    def exists(self) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.location.uri, self.location.storage_options())

    @property
    def lineage(self) -> str:
        return self.data_app_id.split(":")[1]


WRITERS_FOLDER = "_streamkeeper/writers"  # hidden from Delta readers, like _delta_log


def table_writers(target: TableTarget) -> dict[str, dict]:
    """The lineages that declared they write this table: lineage -> their claim."""
    store = target.location.store()
    claims = {}
    for key in store.list(WRITERS_FOLDER):
        claim = store.read_json(key)
        if claim is not None:
            claims[str(claim.get("lineage"))] = claim
    return claims


def check_table_ownership(target: TableTarget, job: str, shared: bool) -> None:
    """Refuse a table another lineage writes, unless every writer says it is shared.

    Raises:
        SpecError: naming the other writers and the fix; nothing is written.
    """
    others = {k: v for k, v in table_writers(target).items() if k != target.lineage}
    if not others:
        return
    if shared and all(claim.get("shared") for claim in others.values()):
        return
    names = ", ".join(f"job {c.get('job')!r} (lineage {k!r})" for k, c in sorted(others.items()))
    raise SpecError(
        f"sink {target.sink!r} of job {job!r} writes table {target.location.uri!r}, which "
        f"{names} also writes. Point the sink at another table (sinks[].table), or, if "
        "several jobs are meant to append to it, set `shared: true` on the sink in every "
        "job that writes it"
    )


def claim_table(target: TableTarget, job: str, shared: bool, output: str) -> None:
    """Record that this lineage writes the table (read by `check_table_ownership`, and by a
    rollback: a merge table shared with another job cannot be rolled back alone)."""
    store = target.location.store()
    key = f"{WRITERS_FOLDER}/{target.lineage}.json"
    claim = {
        "lineage": target.lineage,
        "job": job,
        "sink": target.sink,
        "shared": shared,
        "output": output,
    }
    if store.read_json(key) != claim:
        store.write_json(key, claim)


def fence_table(target: TableTarget, epoch: int, attempts: int = 5) -> int:
    """Commit this runner's epoch to the table before it touches anything else (retried:
    each attempt re-reads the table, so a commit whose response was lost is not repeated).

    After this commit, a commit by any older runner of the lineage is refused by the
    table itself (its fence check, or a conflict if it raced from an older snapshot).

    Returns:
        The table version of the fence commit (or the current one if already fenced).

    Raises:
        FencedError: a newer epoch already committed to the table.
    """
    for attempt in _retrying(attempts):
        with attempt:
            version = _fence_once(target, epoch)
            injection.reached("table_fence_landed", sink=target.sink)
            return version
    raise AssertionError("unreachable")  # pragma: no cover


def restore_table(target: TableTarget, version: int, epoch: int, attempts: int = 5) -> int:
    """Delta RESTORE the table to `version` as the lineage's owner of `epoch`.

    Conditional on the epoch: made from a snapshot whose fence is `epoch`, carrying that
    fence, and never retried by delta-rs onto a newer snapshot (`max_commit_retries=0`).
    A newer owner's fence (another rollback, a start after it) makes it fail with
    FencedError; it can never revert what that owner committed. A RESTORE whose answer
    was lost is not made twice: the latest commit says it is ours.

    Returns:
        The table's version after the restore.

    Raises:
        FencedError: a newer epoch committed to the table.
    """
    for attempt in _retrying(attempts):
        with attempt:
            restored = _restore_once(target, version, epoch)
            injection.reached("table_restore_landed", sink=target.sink)
            return restored
    raise AssertionError("unreachable")  # pragma: no cover


def _restore_once(target: TableTarget, version: int, epoch: int) -> int:
    from deltalake import CommitProperties, Transaction

    table = target.open()
    holder = table.transaction_version(target.fence_app_id)
    if holder is not None and holder > epoch:
        raise _fenced(target, epoch, holder)
    mark = f"{epoch}:{version}"
    if table.history(1)[0].get("streamkeeper.restore") == mark:
        return table.version()  # ours already (an answer lost)
    table.restore(
        version,
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id=target.fence_app_id, version=epoch)],
            custom_metadata={"streamkeeper.restore": mark, "streamkeeper.lineage": target.lineage},
            max_commit_retries=0,
        ),
    )
    return table.version()


def take_back_files(
    target: TableTarget, folder: str, after_seq: int, epoch: int, attempts: int = 5
) -> int:
    """Remove this lineage's files of the seqs after `after_seq` from a shared table.

    A table other jobs also append to is not RESTOREd (that would take their rows away):
    only the files this lineage's batches after the savepoint added leave it, found by
    their folder `{folder}/{seq}/`, in one commit conditional on `epoch` as a RESTORE is.

    Returns:
        The table's version after it.
    """
    for attempt in _retrying(attempts):
        with attempt:
            version = _take_back_once(target, folder, after_seq, epoch)
            injection.reached("table_restore_landed", sink=target.sink)
            return version
    raise AssertionError("unreachable")  # pragma: no cover


def _take_back_once(target: TableTarget, folder: str, after_seq: int, epoch: int) -> int:
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction
    from deltalake.transaction import RemoveAction

    table = target.open()
    holder = table.transaction_version(target.fence_app_id)
    if holder is not None and holder > epoch:
        raise _fenced(target, epoch, holder)
    actions = pa.table(table.get_add_actions(flatten=True))
    now_ms = int(time.time() * 1000)
    removes = [
        RemoveAction(path, True, now_ms, size, {})
        for path, size in zip(
            actions.column("path").to_pylist(),
            actions.column("size_bytes").to_pylist(),
            strict=True,
        )
        if path.startswith(f"{folder}/") and int(path.split("/")[1]) > after_seq
    ]
    if not removes:
        return table.version()
    table.create_write_transaction(
        removes,
        mode="append",
        schema=table.schema(),
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id=target.fence_app_id, version=epoch)],
            custom_metadata={
                "streamkeeper.restore": f"{epoch}:after-{after_seq}",
                "streamkeeper.lineage": target.lineage,
            },
            max_commit_retries=0,
        ),
    )
    return table.version() + 1


def _retrying(attempts: int) -> Retrying:
    """Transient errors (S3, a conflict) retried with backoff; our own errors are final."""
    return Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=0.2, max=5),
        retry=retry_if_exception(_is_retryable),
        reraise=True,
    )


def _fence_once(target: TableTarget, epoch: int) -> int:
    from deltalake import CommitProperties, DeltaTable, Transaction

    table = DeltaTable(target.location.uri, storage_options=target.location.storage_options())
    holder = table.transaction_version(target.fence_app_id)
    if holder is not None and holder > epoch:
        raise _fenced(target, epoch, holder)
    if holder == epoch:
        return table.version()
    table.create_write_transaction(
        [],
        mode="append",
        schema=table.schema(),
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id=target.fence_app_id, version=epoch)],
            custom_metadata={"streamkeeper.fence": str(epoch)},
            max_commit_retries=0,
        ),
    )
    return table.version() + 1


def _fenced(target: TableTarget, epoch: int, holder: int) -> FencedError:
    return FencedError(
        f"runner epoch {epoch} of app {target.fence_app_id!r} is fenced: epoch {holder} "
        f"committed to {target.location.uri!r}. Another runner of this lineage took over; "
        "stop this one (its uncommitted batches are replayed)"
    )


def check_table(target: TableTarget, schema: pa.Schema) -> bool:
    """Check that the table, if it exists, matches `schema`. Reads only.

    Returns:
        Whether the table exists.

    Raises:
        SchemaMismatchError: naming the columns that differ.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(target.location.uri, storage_options=target.location.storage_options())
    except TableNotFoundError:
        return False
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
    return True


def ensure_table(target: TableTarget, schema: pa.Schema) -> None:
    """Create the table with `schema` unless it exists (and matches: `check_table`)."""
    from deltalake import DeltaTable

    if not check_table(target, schema):
        options = target.location.storage_options()
        try:
            DeltaTable.create(target.location.uri, schema=schema, storage_options=options)
        except Exception:  # noqa: BLE001 - another runner may have created it first
            if not check_table(target, schema):
                raise


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

    def refresh(self) -> None:
        """Read the table's newest commits now, so that the next commit's `snapshot` finds
        only what others wrote since. An append leaves the table object before its own
        commit (a merge does not); reading it back here, after the marker, takes ~3 ms
        of the next batch's visibility path."""
        if self._table is not None:
            self._table.update_incremental()

    def commit(self, part: SinkBatch, seq: int) -> int:
        """Commit `part` as commit `seq`; a no-op if the table already holds it.

        Returns:
            The table version that holds commit `seq`.

        Raises:
            FencedError: a newer runner of the lineage has committed to this table.
        """
        for attempt in _retrying(self.attempts):
            with attempt:
                version = self._commit_once(part, seq)
                # A test may lose the answer here: the commit landed, the retry must see it.
                injection.reached("table_commit_landed", sink=self.target.sink, seq=seq)
                return version
        raise AssertionError("unreachable")  # pragma: no cover

    def _commit_once(self, part: SinkBatch, seq: int) -> int:
        table = self.snapshot()
        if part.mode != "at_least_once":
            self._check_fence(table)
            done = table.transaction_version(self.target.data_app_id)
            if done is not None and done >= seq:
                # Already committed: by us before a crash, or a commit whose response was lost.
                return self.version_holding(seq)
        if not part.files:
            return table.version()
        if part.output == "merge":
            return self._merge(table, part, seq)
        return self._append(table, part, seq)

    def version_holding(self, seq: int, search: int = 100) -> int:
        """The table version whose commit carries `seq` (the latest version if not found)."""
        table = self.snapshot()
        wanted = {"streamkeeper.seq": str(seq), "streamkeeper.lineage": self.target.lineage}
        for limit in (search, None):  # the recent commits first; the whole log only if needed
            for commit in table.history(limit):
                if all(commit.get(k) == v for k, v in wanted.items()):
                    return int(commit["version"])
        return table.version()

    def _check_fence(self, table: DeltaTable) -> None:
        holder = table.transaction_version(self.target.fence_app_id)
        if holder is not None and holder > self.epoch:
            raise _fenced(self.target, self.epoch, holder)

    def _transactions(self, seq: int) -> list:
        from deltalake import Transaction

        return [
            Transaction(app_id=self.target.data_app_id, version=seq),
            Transaction(app_id=self.target.fence_app_id, version=self.epoch),
        ]

    def _commit_properties(self, part: SinkBatch, seq: int):  # noqa: ANN202 - deltalake type
        from deltalake import CommitProperties, Transaction

        metadata = {"streamkeeper.seq": str(seq), "streamkeeper.lineage": self.target.lineage}
        if part.mode == "at_least_once":
            # Unchecked, but recorded: the lineage's progress reads the same in every mode.
            data = Transaction(app_id=self.target.data_app_id, version=seq)
            return CommitProperties(app_transactions=[data], custom_metadata=metadata)
        return CommitProperties(
            app_transactions=self._transactions(seq),
            custom_metadata=metadata,
            max_commit_retries=0,
        )

    def _append(self, table: DeltaTable, part: SinkBatch, seq: int) -> int:
        from deltalake.transaction import AddAction

        now_ms = int(time.time() * 1000)
        actions = [AddAction(f.path, f.size, {}, now_ms, True, f.stats) for f in part.files]
        base = table.version()
        table.create_write_transaction(
            actions,
            mode="append",
            schema=table.schema(),
            commit_properties=self._commit_properties(part, seq),
        )
        if part.mode == "at_least_once":  # may have been retried onto a later version
            return self.version_holding(seq, search=10)
        return base + 1  # no retries: the commit is exactly the next version

    def _merge(self, table: DeltaTable, part: SinkBatch, seq: int) -> int:
        rows = read_staged_rows(part, self.target.location, sink=self.target.sink)
        # A null key is one key, as in a GROUP BY: `=` would insert it again every batch.
        predicate = " AND ".join(f"t.{k} IS NOT DISTINCT FROM s.{k}" for k in part.key)
        newer = None
        if part.order_by:
            # Across batches too: a late row (lower order_by) never replaces a newer one.
            column = part.order_by
            newer = f"t.{column} IS NULL OR (s.{column} IS NOT NULL AND s.{column} >= t.{column})"
        (
            table.merge(
                rows,
                predicate=predicate,
                source_alias="s",
                target_alias="t",
                commit_properties=self._commit_properties(part, seq),
            )
            .when_matched_update_all(predicate=newer)
            .when_not_matched_insert_all()
            .execute()
        )
        return table.version()  # merge leaves the table object at its own commit


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
    """Staged merge files (absolute paths on `like`'s file system) as one table.

    Each file is read whole, in one GET (storage/parquet.py: a ranged read that S3
    answers with an error fails unretried, and failed batches). Staged files are one
    batch's rows.
    """
    import pyarrow as pa

    filesystem = like.arrow_filesystem()
    tables = []
    for data_file in files:
        path = data_file.path.removeprefix("s3://") if like.is_s3 else data_file.path
        file = open_parquet_whole(filesystem, path)
        tables.append(file.read(columns=columns, use_threads=False))
    return pa.concat_tables(tables)
