"""The upgrade record: `jobs/{job}/upgrades/{upgrade}.json`, one per upgrade.

Every step of an upgrade (the Airflow tasks, green's driver) reads it, checks that the
upgrade is in the phase the step expects, and moves it on by compare-and-swap, so a
retried or late step can never move an upgrade backwards or run a step twice:

    shadow -> rejected                                   (validation failed; blue untouched)
    shadow -> handover_requested -> handing_over -> live -> promoted
                                                        \\-> rolling_back -> rolled_back
    any -> failed                                        (with the reason)

Pyspark-free: the Airflow layer reads and writes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from streamkeeper.errors import StreamkeeperError
from streamkeeper.storage import ObjectStore

Phase = Literal[
    "shadow",
    "rejected",
    "handover_requested",
    "handing_over",
    "live",
    "promoted",
    "rolling_back",
    "rolled_back",
    "failed",
]
FINAL_PHASES = ("rejected", "promoted", "rolled_back", "failed")


class UpgradeError(StreamkeeperError):
    """An upgrade step found the upgrade elsewhere than it expected, or could not go on."""


@dataclass
class UpgradeRecord:
    """What an upgrade did and where it stands."""

    id: str
    job: str
    lineage: str
    phase: Phase
    blue: dict[str, Any]  # spec_path, run_token, savepoint (S0: green's shadow start)
    green: dict[str, Any]  # spec_path, shadow_job, format, run_token
    created_at: float = field(default_factory=time.time)
    validation: dict[str, Any] | None = None  # the quality gate's report
    handover: dict[str, Any] | None = None  # blue's stop savepoint, table versions, gap
    probation: dict[str, Any] | None = None
    rollback: dict[str, Any] | None = None
    reason: str | None = None  # why the upgrade is where it is (rejected, failed, ...)
    history: list[dict[str, Any]] = field(default_factory=list)  # [{phase, at, reason}]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UpgradeRecord:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    @property
    def finished(self) -> bool:
        return self.phase in FINAL_PHASES


def upgrade_key(job: str, upgrade_id: str) -> str:
    return f"jobs/{job}/upgrades/{upgrade_id}.json"


class UpgradeRecords:
    """The upgrade records of one job."""

    def __init__(self, store: ObjectStore, job: str) -> None:
        self.store = store
        self.job = job

    def create(self, record: UpgradeRecord) -> UpgradeRecord:
        """Write a new record; a retried create of the same upgrade returns the stored one."""
        record.history.append({"phase": record.phase, "at": time.time(), "reason": None})
        if not self.store.create_json(upgrade_key(self.job, record.id), record.to_json()):
            return self.read(record.id)
        return record

    def read(self, upgrade_id: str) -> UpgradeRecord:
        data = self.store.read_json(upgrade_key(self.job, upgrade_id))
        if data is None:
            raise UpgradeError(
                f"job {self.job!r} has no upgrade {upgrade_id!r}; `streamkeeper upgrades "
                f"{self.job}` lists its upgrades"
            )
        return UpgradeRecord.from_json(data)

    def list(self) -> list[UpgradeRecord]:
        """Every upgrade of the job, oldest first (ids sort by time)."""
        keys = self.store.list(f"jobs/{self.job}/upgrades/")
        records = [self.store.read_json(k) for k in keys if k.endswith(".json")]
        return [UpgradeRecord.from_json(r) for r in records if r is not None]

    def update(
        self, upgrade_id: str, change: Callable[[UpgradeRecord], None], *, tries: int = 20
    ) -> UpgradeRecord:
        """Apply `change` by compare-and-swap (re-read and re-applied on a conflict).

        `change` raises UpgradeError when the record is not where the step expects it.
        """
        key = upgrade_key(self.job, upgrade_id)
        for _ in range(tries):
            data, tag = self.store.read_versioned(key)
            if data is None:
                raise UpgradeError(f"job {self.job!r} has no upgrade {upgrade_id!r}")
            record = UpgradeRecord.from_json(data)
            before = record.phase
            change(record)
            if record.phase != before or not record.history:
                entry = {"phase": record.phase, "at": time.time(), "reason": record.reason}
                record.history.append(entry)
            if self.store.write_if(key, record.to_json(), tag) is not None:
                return record
            time.sleep(0.05)
        raise UpgradeError(f"upgrade {upgrade_id!r} of {self.job!r}: too many concurrent changes")

    def advance(
        self,
        upgrade_id: str,
        expected: tuple[str, ...],
        phase: Phase,
        *,
        reason: str | None = None,
        **fields: Any,
    ) -> UpgradeRecord:
        """Move the upgrade from one of `expected` to `phase`, setting `fields`.

        Raises:
            UpgradeError: the upgrade is in another phase (names it and the reason).
        """

        def change(record: UpgradeRecord) -> None:
            if record.phase not in expected:
                raise UpgradeError(
                    f"upgrade {upgrade_id!r} of {self.job!r} is {record.phase}"
                    f"{f' ({record.reason})' if record.reason else ''}, not "
                    f"{' or '.join(expected)}; it cannot move to {phase}"
                )
            record.phase = phase
            if reason is not None:
                record.reason = reason
            for name, value in fields.items():
                setattr(record, name, value)

        return self.update(upgrade_id, change)
