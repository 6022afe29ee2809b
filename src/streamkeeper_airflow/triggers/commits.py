"""An event per stable commit of a job: what turns its tables into Airflow Assets.

`CommittedOutputTrigger` is an event trigger (`BaseEventTrigger`) for `AssetWatcher`s:
the triggerer runs it for as long as a DAG is scheduled on one of the job's tables
(`streamkeeper_airflow.assets`), and Airflow records each event it yields as an asset
event on every asset watched through it (one trigger per job: its tables share it).

It follows the job's *stable point* (`streamkeeper.stable`): the newest commit no
pending rollback can retract. While an upgrade's green is on probation, what it commits
is provisional (a rollback RESTOREs the tables to blue's savepoint), so a downstream DAG
is never scheduled on output that can still disappear. Each event names the commit
marker's seq and batch and, per table, the Delta version holding it: a reader reads
the table as of that version and sees exactly that checkpoint's output.

Events:
    `{"job", "seq", "batch_id", "versions": {sink: version}, "tables": {sink: uri},
    "committed_at", "reason", "rewound"}`; `rewound` is true when the stable point moved
    back (an on-demand rollback to an older savepoint restored the tables).

What it does not do: remember across triggerer restarts. A trigger holds only its
arguments, so a (re)started trigger takes the stable point it finds as its baseline and
fires for the commits after it; commits made while no triggerer ran are not replayed
one by one, but the next event's versions hold them (versions are cumulative). A poll
that fails is logged (redacted) and retried; an asset watcher never gives up.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from streamkeeper_airflow.triggers.base import watch_polls

if TYPE_CHECKING:
    from streamkeeper.stable import StablePoint, StableView
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

DEFAULT_COMMIT_POLL_SECONDS = 10.0


class CommittedOutputTrigger(BaseEventTrigger):
    """Yields an event each time the job's stable point moves.

    Args:
        conn_id: the Airflow connection of the storage root.
        job: the job's name.
        root: the storage root, if not the connection's.
        poll_interval: seconds between polls (one heartbeat and marker listing each).
    """

    def __init__(
        self,
        *,
        conn_id: str,
        job: str,
        root: str | None = None,
        poll_interval: float = DEFAULT_COMMIT_POLL_SECONDS,
    ) -> None:
        super().__init__()
        if float(poll_interval) <= 0:
            raise ValueError(
                f"poll_interval {poll_interval!r} is not positive; expected seconds, e.g. 10"
            )
        self.conn_id = conn_id
        self.job = job
        self.root = root
        self.poll_interval = float(poll_interval)
        self._stable: StableView | None = None  # built at the first poll that finds the job

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            "conn_id": self.conn_id,
            "job": self.job,
            "root": self.root,
            "poll_interval": self.poll_interval,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        baseline: int | None = None  # the stable seq last seen; None: not yet polled
        async for point in watch_polls(
            self,
            self._poll,
            conn_id=self.conn_id,
            root=self.root,
            interval=self.poll_interval,
            what=f"{self.job}: commit",
        ):
            seq = -1 if point is None else point.seq
            if baseline is None:
                baseline = seq
                self.log.info("%s: watching commits after seq %d", self.job, seq)
            elif point is not None and seq != baseline:
                event = commit_event(self.job, point, self._stable, rewound=seq < baseline)
                baseline = seq
                yield TriggerEvent(event)

    def _poll(self, hook: StreamkeeperHook) -> StablePoint | None:
        """The job's stable point now (in a thread); None while it never committed."""
        from streamkeeper.errors import UnknownJobError
        from streamkeeper.stable import StableView
        from streamkeeper.storage import Location

        if self._stable is None:
            try:
                location = Location(hook.root, hook.settings.s3_settings())
                self._stable = StableView(location, self.job)
            except UnknownJobError:
                return None  # never started: no record yet
        return self._stable.point()


def commit_event(
    job: str, point: StablePoint, view: StableView | None, *, rewound: bool = False
) -> dict[str, Any]:
    """The event for one stable point (JSON: Airflow stores it as the asset event's extra)."""
    marker = point.marker
    return {
        "job": job,
        "seq": point.seq,
        "batch_id": marker.get("batch_id"),
        "versions": dict(point.versions),
        "tables": {} if view is None else view.tables(),
        "committed_at": marker.get("committed_at"),
        "reason": point.reason,
        "rewound": rewound,
    }
