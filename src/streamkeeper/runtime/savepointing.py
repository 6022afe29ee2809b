"""Taking a savepoint of the running job at a batch boundary (PROTOCOL.md, "Savepoints").

1. register it `pending` (registry, compare-and-swap by epoch);
2. hold the batch boundary: the batch in flight finishes, no next batch starts;
3. wait for `commits/N` of the last batch that ran, and for the coordinator to commit
   every completed batch (drain): the tables, the lineage head and checkpoint N agree;
4. capture checkpoint N (nothing planned after it): pin it in the checkpoint store
   (uploading it once if checkpoints are not externalized), or copy it into the
   savepoint's folder, or export its state as Delta tables (canonical);
5. write the manifest, mark the entry complete; a stop drains here, still holding the
   boundary; 6. let batches run again; apply savepoint retention.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkeeper.commit.batch import BatchWriter
from streamkeeper.commit.coordinator import CommitCoordinator
from streamkeeper.errors import FencedError, SavepointError
from streamkeeper.lineage.commands import Command
from streamkeeper.lineage.control import Fence
from streamkeeper.runtime.job import JobPaths
from streamkeeper.snapshots import canonical, savepoint_points
from streamkeeper.snapshots.externalized import ExternalizedCheckpoints
from streamkeeper.snapshots.manifest import CheckpointFile
from streamkeeper.snapshots.savepoint_capture import code_version, source_offsets, spec_hash
from streamkeeper.snapshots.savepoint_manifest import (
    SavepointManifest,
    StateOperatorInfo,
    TableSeq,
)
from streamkeeper.snapshots.savepoint_writer import SavepointWriter
from streamkeeper.snapshots.savepoints import SavepointEntry, new_savepoint_id
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint
from streamkeeper.snapshots.state_metadata import read_operators
from streamkeeper.spec import JobSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)
POLL_SECONDS = 0.01


@dataclass(frozen=True)
class SavepointRequest:
    format: str = "native"  # native | canonical
    self_contained: bool = False
    command_id: str | None = None
    hold: str | None = None  # born held by this holder (an upgrade's rollback target)

    @classmethod
    def of(cls, command: Command) -> SavepointRequest:
        return cls(command.format, command.self_contained, command.id, command.hold)


@dataclass(frozen=True)
class QueryAttempt:
    """The running query and what runs its batches."""

    query: StreamingQuery
    writer: BatchWriter
    coordinator: CommitCoordinator

    @property
    def checkpoint(self) -> SparkCheckpoint:
        return self.writer.ctx.checkpoint


@dataclass
class SavepointOutcome:
    savepoint_id: str
    manifest: SavepointManifest
    in_flight: int | None  # the batch that was running when the savepoint was asked for
    timings: dict[str, float] = field(default_factory=dict)  # milliseconds per step
    deleted_by_retention: list[str] = field(default_factory=list)


class _Laps:
    def __init__(self) -> None:
        self.started = self._last = time.monotonic()
        self.ms: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.ms[name] = round((now - self._last) * 1000, 1)
        self._last = now

    def total(self) -> dict[str, float]:
        return {**self.ms, "total": round((time.monotonic() - self.started) * 1000, 1)}


class SavepointTaker:
    """Takes savepoints of one runner's job; owned by the runner (its epoch)."""

    def __init__(
        self,
        *,
        spec: JobSpec,
        spec_dir: Path,
        paths: JobPaths,
        fence: Fence,
        spark: SparkSession,
        checkpoints: ExternalizedCheckpoints | None,
    ) -> None:
        self.spec = spec
        self.spec_dir = spec_dir
        self.paths = paths
        self.fence = fence
        self.spark = spark
        self.store = paths.root.store()
        self.layout = paths.layout
        self.writer = SavepointWriter(
            self.store,
            self.layout,
            paths.checkpoint_dir,
            epoch=fence.epoch,
            guard=fence.check,
            checkpoints=checkpoints,
        )
        self._operators: dict[tuple[str, int], list[StateOperatorInfo]] = {}

    def take(
        self,
        request: SavepointRequest,
        attempt: QueryAttempt,
        then: Callable[[], None] | None = None,
    ) -> SavepointOutcome:
        """Take a savepoint; `then` runs once it is complete, still at the boundary.

        Raises:
            SavepointError: it cannot be taken now (names why); nothing is left of it.
            FencedError: this runner lost the lineage.
        """
        laps, started = _Laps(), time.time()
        savepoint_id = new_savepoint_id(started)
        self._fenced_by(lambda: self.writer.register(self._entry(savepoint_id, request, started)))
        try:
            timeout = self.spec.checkpoint.timeout
            with attempt.writer.boundary.between_batches(timeout) as in_flight:
                laps.lap("wait_for_boundary")
                batch_id = self._wait_for_completion(attempt, timeout)
                attempt.coordinator.drain(timeout)
                laps.lap("drain")
                manifest = self._fenced_by(
                    lambda: self._capture(request, savepoint_id, attempt, batch_id, started)
                )
                laps.lap("capture")
                self._fenced_by(lambda: self.writer.complete(manifest))
                laps.lap("commit")
                if then is not None:
                    then()
        except FencedError:
            raise  # not ours any more: the next owner's sweep removes what is left
        except BaseException:
            self.writer.abandon(savepoint_id)
            raise
        retention = self.spec.savepoints
        deleted = self._fenced_by(
            lambda: self.writer.retention(retention.retained, retention.max_age)
        )
        log.info(
            "savepoint %s taken at batch %d (seq %d), %s, %d files, %d bytes: %s",
            savepoint_id,
            manifest.batch_id,
            manifest.seq,
            f"{manifest.format}/{manifest.storage}",
            len(manifest.files),
            manifest.size,
            laps.total(),
        )
        return SavepointOutcome(savepoint_id, manifest, in_flight, laps.total(), deleted)

    def stop_at_boundary(self, attempt: QueryAttempt, then: Callable[[], None]) -> int | None:
        """Reach a batch boundary with every completed batch committed, then run `then`.

        Returns:
            The last batch completed (None if the job never completed one).
        """
        timeout = self.spec.checkpoint.timeout
        with attempt.writer.boundary.between_batches(timeout):
            try:
                batch_id: int | None = self._wait_for_completion(attempt, timeout)
            except SavepointError:
                batch_id = None  # nothing completed yet: nothing to wait for
            attempt.coordinator.drain(timeout)
            then()
        return batch_id

    # -- steps -------------------------------------------------------------------------

    def _entry(self, savepoint_id: str, request: SavepointRequest, started: float) -> Any:
        return SavepointEntry(
            id=savepoint_id,
            job=self.spec.name,
            lineage=self.layout.lineage,
            format=request.format,
            storage=_storage(request),
            epoch=self.fence.epoch,
            created_at=started,
            command_id=request.command_id,
            holds={}
            if request.hold is None
            else {request.hold: "taken for it, held until it acts"},
        )

    def _wait_for_completion(self, attempt: QueryAttempt, timeout: float) -> int:
        """The last batch that ran, once Spark wrote its `commits/N`."""
        checkpoint = attempt.checkpoint
        batch_id = attempt.writer.boundary.last_returned
        if batch_id is None:
            batch_id = checkpoint.latest_complete()
        if batch_id is None:
            raise SavepointError(
                f"job {self.spec.name!r} has not completed a batch yet: there is nothing to "
                "save; send the savepoint again after its first checkpoint"
            )
        deadline = time.monotonic() + timeout
        while not checkpoint.is_complete(batch_id):
            if not attempt.query.isActive:
                raise SavepointError(
                    f"the query ended before batch {batch_id} completed; no savepoint taken"
                )
            if time.monotonic() > deadline:
                raise SavepointError(
                    f"batch {batch_id} did not complete within checkpoint.timeout "
                    f"{timeout:g}s; no savepoint taken"
                )
            time.sleep(POLL_SECONDS)
        return batch_id

    def _head(self, attempt: QueryAttempt, batch_id: int) -> dict[str, Any]:
        """The commit marker of batch N: the lineage head must be checkpoint N."""
        stats = attempt.coordinator.stats
        marker = self.store.read_json(self.layout.marker(stats.last_seq))
        query_id = attempt.checkpoint.query_id()
        if marker is None or marker["batch_id"] != batch_id or marker["query_id"] != query_id:
            where = None if marker is None else (marker["seq"], marker["batch_id"])
            raise SavepointError(
                f"the lineage head (seq, batch) {where} is not batch {batch_id} of the "
                f"checkpoint directory {str(attempt.checkpoint.directory)!r} (it was restored, "
                "or its batches were not committed by this runner yet); send the savepoint "
                "again after the next checkpoint"
            )
        return marker

    def _capture(
        self,
        request: SavepointRequest,
        savepoint_id: str,
        attempt: QueryAttempt,
        batch_id: int,
        started: float,
    ) -> SavepointManifest:
        marker = self._head(attempt, batch_id)
        seq, directory = int(marker["seq"]), attempt.checkpoint.directory
        offsets, metadata = source_offsets(directory, batch_id)
        operators = self._operators_of(attempt, batch_id)
        files, exported = self._files(request, savepoint_id, seq, batch_id, operators)
        canonical_operators, source = exported if exported is not None else (None, None)
        return SavepointManifest(
            id=savepoint_id,
            job=self.spec.name,
            lineage=self.layout.lineage,
            format=request.format,  # type: ignore[arg-type]
            storage=_storage(request),  # type: ignore[arg-type]
            seq=seq,
            batch_id=batch_id,
            query_id=str(marker["query_id"]),
            spark_version=self.spark.version,
            spec_hash=spec_hash(self.spec),
            code_version=code_version(self.spec, self.spec_dir),
            state_backend=self.spec.state_backend.type,
            partitions=int(metadata.get("conf", {}).get("spark.sql.shuffle.partitions", 0) or 0),
            operators=canonical_operators or operators,
            source_offsets=offsets,
            tables={
                name: TableSeq(target.location.uri, seq, marker["versions"].get(name))
                for name, target in self.paths.targets.items()
            },
            files=files,
            checkpoint_id=seq,
            source=source,
            sink_seqs={name: seq for name in self.paths.targets} if exported else {},
            epoch=self.fence.epoch,
            command_id=request.command_id,
            started_at=started,
        )

    def _files(
        self,
        request: SavepointRequest,
        savepoint_id: str,
        seq: int,
        batch_id: int,
        operators: list[StateOperatorInfo],
    ) -> tuple[list[CheckpointFile], tuple[list[StateOperatorInfo], dict[str, Any]] | None]:
        if request.format == "canonical":
            folder = self.paths.root.child(self.layout.savepoint(savepoint_id))
            uids = {o.operator_id: o.uid for o in operators}
            self.fence.check()
            exported, source = canonical.export_state(
                self.spark, self.paths.checkpoint_dir, folder, batch_id, uids
            )
            savepoint_points.reached("savepoint_after_pin")
            return [], ([StateOperatorInfo.from_json(o) for o in exported], source)
        if request.self_contained:
            return self.writer.self_contained(savepoint_id, seq, batch_id), None
        return self.writer.pinned(savepoint_id, seq, batch_id), None

    def _operators_of(self, attempt: QueryAttempt, batch_id: int) -> list[StateOperatorInfo]:
        """Spark's state metadata; the operators do not change within one query run."""
        key = (attempt.checkpoint.query_id() or "", id(attempt.writer))
        if key not in self._operators:
            uids = canonical.operator_uids(self.spec)
            directory = attempt.checkpoint.directory
            self._operators[key] = read_operators(self.spark, directory, batch_id, uids)
        return self._operators[key]

    def _fenced_by(self, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except FencedError as error:
            self.fence.mark_fenced(error)
            raise


def _storage(request: SavepointRequest) -> str:
    if request.format == "canonical" or request.self_contained:
        return "self_contained"
    return "pinned"
