"""A job's tables as Airflow Assets, with an event for every stable commit.

    from streamkeeper_airflow.assets import job_table_assets

    totals = job_table_assets("keyed-totals")["totals"]

    @dag(schedule=[totals])
    def report():
        @task(inlets=[totals])
        def read(*, triggering_asset_events):
            version = committed_version(triggering_asset_events[totals][-1], "totals")
            ...  # DeltaTable(uri, version=version): exactly that checkpoint's output

Each sink table is an Asset named `{job}.{sink}` whose URI is the table's (`s3://...`,
or `file:///...` on local storage), so it is the same Asset as any other DAG that names
the table by its URI. All of a job's assets are watched by one `CommittedOutputTrigger`
(triggers/commits.py): each time the job's stable point moves (a checkpoint committed
and no pending rollback can retract it), every table of the job gets an asset event
whose extra holds the commit's seq, batch and each table's Delta version.

The table URIs come from the job's spec (its sinks' `table`, below the storage root)
and the connection's storage root, both read when the DAG file is parsed.

`job_health_asset(job)` is the job's health (`{job}.health`), watched by a
`JobHealthTrigger` (triggers/health.py) that fires on each health change: what the
monitor DAG (`{job}.monitor`) is scheduled on instead of polling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow.sdk import Asset, AssetWatcher

from streamkeeper_airflow.hooks.streamkeeper import DEFAULT_CONN_ID
from streamkeeper_airflow.triggers.commits import (
    DEFAULT_COMMIT_POLL_SECONDS,
    CommittedOutputTrigger,
)
from streamkeeper_airflow.triggers.health import (
    DEFAULT_FAILED_REPEAT_SECONDS,
    DEFAULT_HEALTH_POLL_SECONDS,
    JobHealthTrigger,
)

ASSET_GROUP = "streamkeeper"


def job_table_assets(
    job: str,
    *,
    conn_id: str = DEFAULT_CONN_ID,
    root: str | None = None,
    jobs_folder: str | Path | None = None,
    poll_interval: float = DEFAULT_COMMIT_POLL_SECONDS,
) -> dict[str, Asset]:
    """The job's tables as Assets by sink name, watched for the job's stable commits.

    Args:
        job: the job's name (its spec's `name`).
        conn_id: the connection of the job's storage root.
        root: the storage root, if not the connection's.
        jobs_folder: where the job's spec is (`{folder}/*/job.yaml`); default
            `[streamkeeper] jobs_folder`.
        poll_interval: seconds between the watcher's polls of the job's commits.
    """
    from streamkeeper.storage import Location

    spec = _job_spec(job, jobs_folder)
    storage_root = Location(root or _connection_root(conn_id))
    trigger = CommittedOutputTrigger(
        conn_id=conn_id, job=job, root=root, poll_interval=poll_interval
    )
    return {
        sink.name: Asset(
            uri=asset_uri(storage_root.child(sink.table_path).uri),
            name=f"{job}.{sink.name}",
            group=ASSET_GROUP,
            extra={"job": job, "sink": sink.name},
            watchers=[AssetWatcher(name=f"{job}.commits", trigger=trigger)],
        )
        for sink in spec.sinks
    }


def job_health_asset(
    job: str,
    *,
    conn_id: str = DEFAULT_CONN_ID,
    root: str | None = None,
    poll_interval: float = DEFAULT_HEALTH_POLL_SECONDS,
    failed_repeat: float = DEFAULT_FAILED_REPEAT_SECONDS,
) -> Asset:
    """The job's health as an Asset (`{job}.health`, `streamkeeper://{job}/health`),
    watched by a `JobHealthTrigger`: an asset event per health change (triggers/health.py).
    The monitor DAG is scheduled on it; nothing is read at parse time.

    Args:
        job: the job's name.
        conn_id: the connection of the job's storage root.
        root: the storage root, if not the connection's.
        poll_interval: seconds between the watcher's status reads.
        failed_repeat: seconds after which a job still FAILED fires again.
    """
    trigger = JobHealthTrigger(
        conn_id=conn_id,
        job=job,
        root=root,
        poll_interval=poll_interval,
        failed_repeat=failed_repeat,
    )
    return Asset(
        uri=f"streamkeeper://{job}/health",
        name=f"{job}.health",
        group=ASSET_GROUP,
        extra={"job": job},
        watchers=[AssetWatcher(name=f"{job}.health", trigger=trigger)],
    )


def asset_uri(table: str) -> str:
    """A table location as an Asset URI: `s3://...` as it is, a local path as `file://`."""
    return table if "://" in table else Path(table).resolve().as_uri()


def committed_version(asset_event: Any, sink: str) -> int:
    """The Delta version of `sink`'s table that an asset event of `job_table_assets` names.

    Args:
        asset_event: one of the `triggering_asset_events` (or its `extra` dict).
    """
    extra = asset_event if isinstance(asset_event, dict) else asset_event.extra
    payload = (extra or {}).get("payload") or {}
    versions = payload.get("versions") or {}
    if sink not in versions:
        raise KeyError(
            f"asset event {extra!r} names no version of sink {sink!r}; it is not an event of "
            "streamkeeper's commit watcher, or the sink committed nothing stable yet "
            f"(sinks with a version: {sorted(versions)})"
        )
    return int(versions[sink])


def _connection_root(conn_id: str) -> str:
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

    return StreamkeeperHook(conn_id).root


def _job_spec(job: str, jobs_folder: str | Path | None) -> Any:
    from streamkeeper_airflow import settings
    from streamkeeper_airflow.dag_factory import find_jobs

    folder = jobs_folder or settings.option("jobs_folder")
    if not folder:
        raise ValueError(
            f"no jobs folder to find job {job!r} in; pass jobs_folder= or set "
            "[streamkeeper] jobs_folder (AIRFLOW__STREAMKEEPER__JOBS_FOLDER)"
        )
    entries = {entry.name: entry for entry in find_jobs(Path(folder))}
    if job not in entries:
        raise ValueError(
            f"job {job!r} has no valid spec in {folder}/*/job.yaml; jobs there: "
            f"{sorted(entries) or 'none'}"
        )
    return entries[job].spec
