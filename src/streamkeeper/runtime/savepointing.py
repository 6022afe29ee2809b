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
from streamkeeper.lineage.control import Fence
from streamkeeper.runtime.job import JobPaths
from streamkeeper.snapshots import canonical, savepoint_points
from streamkeeper.snapshots.externalized import (
    CheckpointUploader,
    ExternalizedCheckpoints,
    pin_checkpoint,
    stored_checkpoint,
)
from streamkeeper.snapshots.manifest import CheckpointFile, scan_checkpoint
from streamkeeper.snapshots.savepoint_capture import (
    SelfContainedCopy,
    code_version,
    in_savepoint,
    non_state,
    savepoint_view,
    source_offsets,
    spec_hash,
)
from streamkeeper.snapshots.savepoint_disposal import apply_savepoint_retention, delete_savepoint
from streamkeeper.snapshots.savepoint_manifest import (
    CANONICAL_FOLDER,
    SavepointManifest,
    StateOperatorInfo,
    TableSeq,
)
from streamkeeper.snapshots.savepoints import SavepointEntry, SavepointRegistry, new_savepoint_id
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
        self.checkpoints = checkpoints
        self.store = paths.root.store()
        self.layout = paths.layout
        self.registry = SavepointRegistry(self.store, self.layout)
        self._uploader: CheckpointUploader | None = None  # when checkpoints are not externalized
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
        self._register(savepoint_id, request, started)
        try:
            timeout = self.spec.checkpoint.timeout
            with attempt.writer.boundary.between_batches(timeout) as in_flight:
                laps.lap("wait_for_boundary")
                batch_id = self._wait_for_completion(attempt, timeout)
                attempt.coordinator.drain(timeout)
                laps.lap("drain")
                manifest = self._capture(request, savepoint_id, attempt, batch_id, started)
                laps.lap("capture")
                self._complete(manifest)
                laps.lap("commit")
                if then is not None:
                    then()
        except FencedError:
            raise  # not ours any more: the next owner's sweep removes what is left
        except BaseException:
            self._abandon(savepoint_id)
            raise
        deleted = self._retention()
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

    def _register(self, savepoint_id: str, request: SavepointRequest, started: float) -> None:
        entry = SavepointEntry(
            id=savepoint_id,
            job=self.spec.name,
            lineage=self.layout.lineage,
            format=request.format,
            storage=self._storage(request),
            epoch=self.fence.epoch,
            created_at=started,
            command_id=request.command_id,
        )
        self.fence.check()
        self._fenced_by(lambda: self.registry.update(_append(entry), self.fence.epoch))
        savepoint_points.reached("savepoint_after_register")

    @staticmethod
    def _storage(request: SavepointRequest) -> str:
        if request.format == "canonical" or request.self_contained:
            return "self_contained"
        return "pinned"

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
        canonical_state, checkpoint_id = None, None
        if request.format == "canonical":
            files, canonical_state = self._canonical(savepoint_id, directory, batch_id, operators)
        elif request.self_contained:
            files = self._self_contained(savepoint_id, directory, seq, batch_id)
        else:
            files, checkpoint_id = self._pinned(savepoint_id, seq, batch_id), seq
        savepoint_points.reached("savepoint_after_pin")
        conf = metadata.get("conf", {})
        return SavepointManifest(
            id=savepoint_id,
            job=self.spec.name,
            lineage=self.layout.lineage,
            format=request.format,  # type: ignore[arg-type]
            storage=self._storage(request),  # type: ignore[arg-type]
            seq=seq,
            batch_id=batch_id,
            query_id=str(marker["query_id"]),
            spark_version=self.spark.version,
            spec_hash=spec_hash(self.spec),
            code_version=code_version(self.spec, self.spec_dir),
            state_backend=self.spec.state_backend.type,
            partitions=int(conf.get("spark.sql.shuffle.partitions", 0) or 0),
            operators=operators,
            source_offsets=offsets,
            tables={
                name: TableSeq(target.location.uri, seq, marker["versions"].get(name))
                for name, target in self.paths.targets.items()
            },
            files=files,
            checkpoint_id=checkpoint_id,
            canonical=canonical_state,
            epoch=self.fence.epoch,
            command_id=request.command_id,
            started_at=started,
        )

    def _operators_of(self, attempt: QueryAttempt, batch_id: int) -> list[StateOperatorInfo]:
        """Spark's state metadata; the operators do not change within one query run."""
        key = (attempt.checkpoint.query_id() or "", id(attempt.writer))
        if key not in self._operators:
            uids = canonical.operator_uids(self.spec)
            directory = attempt.checkpoint.directory
            self._operators[key] = read_operators(self.spark, directory, batch_id, uids)
        return self._operators[key]

    def _pinned(self, savepoint_id: str, seq: int, batch_id: int) -> list[CheckpointFile]:
        if self.checkpoints is not None:
            base = self.checkpoints.pin_for_savepoint(savepoint_id, seq, batch_id)
        else:
            uploader = self._own_uploader()

            def capture() -> Any:
                stored = stored_checkpoint(uploader, seq, batch_id, self.fence.check)
                pin_checkpoint(uploader, savepoint_id, seq)
                uploader.discard_all()  # not externalized: keep only what savepoints pin
                return stored

            self.fence.check()
            base = self._fenced_by(capture)
        return savepoint_view(base.files, batch_id)

    def _own_uploader(self) -> CheckpointUploader:
        if self._uploader is None:
            directory = self.paths.checkpoint_dir
            self._uploader = CheckpointUploader(
                self.store, self.layout, directory, epoch=self.fence.epoch
            )
        return self._uploader

    def _self_contained(
        self, savepoint_id: str, directory: Path, seq: int, batch_id: int
    ) -> list[CheckpointFile]:
        copier = SelfContainedCopy(self.store, directory, self.layout.savepoint(savepoint_id))
        base = None if self.checkpoints is None else self.checkpoints.stored(seq, batch_id)
        self.fence.check()
        if base is not None:  # in the store already: copied there (server-side on S3)
            return copier.copy(savepoint_view(base.files, batch_id), [])
        local = [f for f in scan_checkpoint(directory) if in_savepoint(f.path, batch_id)]
        return copier.copy([], local)

    def _canonical(
        self,
        savepoint_id: str,
        directory: Path,
        batch_id: int,
        operators: list[StateOperatorInfo],
    ) -> tuple[list[CheckpointFile], dict[str, Any]]:
        folder = self.layout.savepoint(savepoint_id)
        target = self.paths.root.child(f"{folder}/{CANONICAL_FOLDER}")
        uids = {o.operator_id: o.uid for o in operators}
        self.fence.check()
        state = canonical.export_state(self.spark, directory, target, batch_id, uids)
        local = [
            f
            for f in scan_checkpoint(directory)
            if in_savepoint(f.path, batch_id) and not f.path.startswith("state/")
        ]
        files = SelfContainedCopy(self.store, directory, folder).copy([], local)
        return non_state(files), state

    def _complete(self, manifest: SavepointManifest) -> None:
        savepoint_points.reached("savepoint_before_manifest")
        manifest.ended_at = time.time()
        self.fence.check()
        self.store.write_json(self.layout.savepoint_manifest(manifest.id), manifest.to_json())
        savepoint_points.reached("savepoint_after_manifest")
        self._fenced_by(lambda: self.registry.update(_completed(manifest), self.fence.epoch))
        savepoint_points.reached("savepoint_after_complete")

    def _abandon(self, savepoint_id: str) -> None:
        """A savepoint that failed: remove what it left now (the sweep does otherwise)."""
        try:
            self.fence.check()
            delete_savepoint(
                self.store, self.layout, savepoint_id, epoch=self.fence.epoch, abandoned=True
            )
        except Exception:  # noqa: BLE001 - the savepoint's own error is the one to report
            log.warning("could not remove failed savepoint %s", savepoint_id, exc_info=True)

    def _retention(self) -> list[str]:
        """Savepoint retention, after a savepoint: garbage collection, never a failure."""
        retention = self.spec.savepoints
        try:
            self.fence.check()
            return apply_savepoint_retention(
                self.store,
                self.layout,
                retained=retention.retained,
                max_age=retention.max_age,
                epoch=self.fence.epoch,
            )
        except FencedError:
            raise
        except Exception:  # noqa: BLE001 - retried after the next savepoint
            log.warning("savepoint retention failed; retried next time", exc_info=True)
            return []

    def _fenced_by(self, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except FencedError as error:
            self.fence.mark_fenced(error)
            raise


def _append(entry: SavepointEntry) -> Callable[[Any], None]:
    return lambda registry: registry.savepoints.append(entry)


def _completed(manifest: SavepointManifest) -> Callable[[Any], None]:
    def mark(registry: Any) -> None:
        found = registry.find(manifest.id)
        if found is None:
            raise SavepointError(f"savepoint {manifest.id!r} vanished from the registry")
        found.state = "complete"
        found.completed_at = manifest.ended_at
        found.seq, found.batch_id = manifest.seq, manifest.batch_id
        found.checkpoint_id, found.size = manifest.checkpoint_id, manifest.size

    return mark
