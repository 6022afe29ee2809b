"""The stable (read-committed) view of a job's output: what no pending rollback can retract.

While an upgrade's green is on probation (phase `live`) or being rolled back
(`rolling_back`), everything the lineage committed after blue's stop savepoint S1 is
provisional: a rollback Delta-RESTOREs every table to S1's versions. A rollback that
restored the tables and was not finished (`rewind-pending.json`) holds its savepoint the
same way. The *stable point* is the newest commit marker at or below the lowest such
seq; otherwise the lineage's head. A head whose versions a RESTORE has since retracted
(an on-demand rollback whose restart has not committed yet) is not stable either: the
newest marker the restore kept is.

Pyspark-free and cheap: the job record, the upgrade records not yet known to be final
(final ones never change phase; a long-lived `StableView` remembers them), the pending
rewind, the latest epoch (a HEAD or two) and the head found near the heartbeat's seq;
the tables' logs are read only after a runner took the lineage since the head's commit,
and then only the commits after the head's versions.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamkeeper.errors import SpecError, StreamkeeperError
from streamkeeper.lineage.control import ControlPlane
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.lineage.markers import latest_marker, marker_at_or_below
from streamkeeper.storage import Location, S3Settings, resolve_root
from streamkeeper.upgrade.record import FINAL_PHASES, UpgradeRecord, UpgradeRecords

PROVISIONAL_PHASES = ("live", "rolling_back")


@dataclass(frozen=True)
class StablePoint:
    """A commit marker no pending rollback can retract, and why it is the one."""

    seq: int
    versions: dict[str, int]  # table version per sink (a sink absent: nothing stable yet)
    reason: str  # "head", or what holds the view below it
    marker: dict[str, Any] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "versions": dict(self.versions), "reason": self.reason}


class StableView:
    """One job's stable point, recomputed on every call (a reader polls it)."""

    def __init__(self, root: Location | str, job: str) -> None:
        from streamkeeper.client import StreamkeeperClient

        if isinstance(root, str):
            root = Location(resolve_root(root), S3Settings.from_env())
        self.client = StreamkeeperClient(root.uri, root.s3)
        self.record = self.client.job_record(job)  # raises UnknownJobError naming the jobs
        self.job = job
        self.store = self.client.store
        self.layout = LineageLayout(self.client.location, self.record.lineage, job)
        self._final: set[str] = set()  # upgrade ids in a final phase: never provisional again

    def tables(self) -> dict[str, str]:
        """The job's tables (their URIs) by sink."""
        return {name: t.table for name, t in self.record.tables.items()}

    def point(self) -> StablePoint | None:
        """The stable point; None if nothing of the lineage is stable (it never committed)."""
        self.record = self.client.job_record(self.job)  # each start rewrites it (its tables)
        beat = self.store.read_json(self.layout.heartbeat) or {}
        hint = beat.get("last_committed_seq")
        near = int(hint) if isinstance(hint, int) and hint >= 0 else None
        head = latest_marker(self.store, self.layout, near=near)
        if head is None:
            return None
        holds = self._holds()
        seq, reason = min(holds) if holds else (int(head["seq"]), "head")
        kept = self._restored_since(head)
        if kept:
            reason = "; ".join([reason, *(why for _, why in kept.values())])
        if seq >= int(head["seq"]) and not kept:
            marker: dict[str, Any] | None = head
        else:
            marker = marker_at_or_below(
                self.store, self.layout, min(seq, int(head["seq"])), _kept_by(kept)
            )
        if marker is None:
            return None
        versions = {k: int(v) for k, v in (marker.get("versions") or {}).items()}
        return StablePoint(int(marker["seq"]), versions, reason, marker)

    def _holds(self) -> list[tuple[int, str]]:
        """(seq, why) of everything after which the output is provisional."""
        holds = []
        for record in self._pending_upgrades():
            handover = record.handover or {}
            if "seq" not in handover:
                raise StreamkeeperError(
                    f"upgrade {record.id!r} of job {self.job!r} is {record.phase} but records "
                    "no handover seq (S1): its record is damaged; inspect it with "
                    f"`streamkeeper upgrades {self.job}`"
                )
            holds.append(
                (int(handover["seq"]), f"upgrade {record.id} is {record.phase}: held at S1")
            )
        pending = self.store.read_json(self.layout.rewind_pending)
        if pending is not None:
            holds.append(self._rewind_hold(str(pending.get("savepoint"))))
        return holds

    def _pending_upgrades(self) -> list[UpgradeRecord]:
        records = UpgradeRecords(self.store, self.job)
        pending = []
        for key in self.store.list(f"jobs/{self.job}/upgrades"):
            upgrade_id = key.rsplit("/", 1)[-1].removesuffix(".json")
            if upgrade_id in self._final or not key.endswith(".json"):
                continue
            record = records.read(upgrade_id)
            if record.phase in FINAL_PHASES:
                self._final.add(upgrade_id)
            elif record.phase in PROVISIONAL_PHASES:
                pending.append(record)
        return pending

    def _rewind_hold(self, savepoint_id: str) -> tuple[int, str]:
        from streamkeeper.snapshots.savepoint_manifest import SavepointPlace

        manifest = SavepointPlace(self.store, self.layout.savepoint(savepoint_id)).read()
        if manifest is None:
            raise StreamkeeperError(
                f"job {self.job!r} has a rollback pending to savepoint {savepoint_id!r}, which "
                "has no manifest; run the rollback again (`streamkeeper status "
                f"{self.job}` names it)"
            )
        return manifest.seq, f"rollback to savepoint {savepoint_id} pending"

    def _restored_since(self, head: dict[str, Any]) -> dict[str, tuple[int, str]]:
        """Sinks whose table a RESTORE returned below the head's version: (target, why).

        Only after a runner (or a rollback) took the lineage since the head's commit; then
        the commits after the head's versions are few (fences, a restore, a batch)."""
        from streamkeeper.sources.delta_log import read_commit_if_any

        if ControlPlane(self.store, self.layout).latest_epoch() <= int(head.get("epoch") or 0):
            return {}
        kept: dict[str, tuple[int, str]] = {}
        for sink, version in (head.get("versions") or {}).items():
            if sink not in self.record.tables:
                continue
            location = Location(self.record.tables[sink].table, self.client.location.s3)
            after = int(version) + 1
            while (commit := read_commit_if_any(location, after)) is not None:
                target = -1 if commit.restored_to is None else commit.restored_to
                if commit.is_restore and target < int(version):
                    low = min(target, kept.get(sink, (target, ""))[0])
                    kept[sink] = (low, f"table {sink} restored at version {after} to {target}")
                after += 1
        return kept

    def sink_of(self, table: str) -> str:
        """The sink of this job that writes `table`.

        Raises:
            SpecError: no sink of the job writes it (names the job's tables).
        """
        for sink, uri in self.tables().items():
            if _same_table(uri, table):
                return sink
        raise SpecError(
            f"table {table!r} is not one of job {self.job!r}'s tables "
            f"({', '.join(f'{s}: {u}' for s, u in sorted(self.tables().items())) or 'none'}); "
            "point source.table at one of them, or name the job that writes it"
        )


def _kept_by(kept: dict[str, tuple[int, str]]) -> Callable[[dict[str, Any]], bool] | None:
    """Markers whose versions every restore since the head kept (None: no restore)."""
    if not kept:
        return None

    def accept(marker: dict[str, Any]) -> bool:
        versions = marker.get("versions") or {}
        return all(int(versions.get(s, -1)) <= target for s, (target, _) in kept.items())

    return accept


def _same_table(a: str, b: str) -> bool:
    def norm(uri: str) -> str:
        uri = uri.removeprefix("file://").rstrip("/")
        return uri if "://" in uri else os.path.normpath(os.path.abspath(uri))

    return norm(a) == norm(b)


def stable_point(root: Location | str, job: str) -> StablePoint | None:
    """The job's stable point (module doc); None if the lineage never committed.

    Raises:
        UnknownJobError: no such job under the root (names the jobs there are).
    """
    return StableView(root, job).point()


def read_stable(root: Location | str, job: str, sink: str) -> list[dict[str, Any]]:
    """The rows of `sink`'s table as of the job's stable point ([] if nothing is stable).

    Raises:
        UnknownJobError: no such job under the root.
        SpecError: the job has no such sink (names its sinks).
    """
    from streamkeeper.reader import read_table_rows

    view = StableView(root, job)
    tables = view.tables()
    if sink not in tables:
        raise SpecError(
            f"job {job!r} has no sink {sink!r}; its sinks: {', '.join(sorted(tables)) or 'none'}"
        )
    point = view.point()
    if point is None or sink not in point.versions:
        return []
    location = Location(tables[sink], view.client.location.s3)
    return read_table_rows(location.uri, version=point.versions[sink], location=location)
