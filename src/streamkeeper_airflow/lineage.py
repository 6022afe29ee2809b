"""OpenLineage for the operators, through apache-airflow-providers-openlineage.

The provider's listener asks each operator for `get_openlineage_facets_on_start()` and
`..._on_complete(task_instance)` (also used on failure); the operators answer with the
small functions here. The provider is optional: without it every function returns None
(or nothing), and the DAGs run as before.

Datasets follow OpenLineage's naming (https://openlineage.io/docs/spec/naming):

    source file    the folder: namespace `file`, name its absolute path (or s3://bucket + key)
    source nats    namespace `nats://host:port`, name the stream (`stream/subject` with one)
    source delta   the table's location, named like a sink's
    source rate    none (Spark generates its rows)
    sink           the table's location: namespace `s3://bucket`, name the key; or `file`
                   and the absolute path (the same table the job's Airflow Assets name)

Run facets, by their key in the event's `run.facets`:

    streamkeeper_run        the start: run token, epoch, how it started (checkpoint or
                            savepoint id), the last committed seq once it ran
    streamkeeper_savepoint  a savepoint (or a stop with one): id, format, storage, seq
    streamkeeper_upgrade    a blue-green upgrade: id, phase, blue's and green's run tokens,
                            the handover's savepoint and seq

Parent run: like the Spark provider's `SparkSubmitOperator` with `[openlineage]
spark_inject_parent_job_info`, the start passes the task's run to the driver as Spark
properties (`spark.openlineage.parentJobNamespace`, `parentJobName`, `parentRunId` and
the root*), so an OpenLineage Spark listener on the cluster links its events to it.
Transport settings are never passed: they can hold an API key, and Spark properties
reach the driver's command line.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlparse

if TYPE_CHECKING:
    from streamkeeper.spec import JobSpec, SourceSpec

log = logging.getLogger(__name__)

try:  # the openlineage provider brings openlineage-python (and attrs)
    from attrs import define
    from openlineage.client.facet_v2 import RunFacet

    CLIENT = True
except ImportError:  # pragma: no cover - exercised where the provider is absent
    CLIENT = False

if CLIENT:

    @define
    class StreamkeeperRunFacet(RunFacet):
        """The run of a job's driver that a start launched or attached to."""

        # A run token names a task instance (a hash of its ids), not a credential: kept
        # out of the redaction that masks any field named like a token.
        _additional_skip_redact: ClassVar[list[str]] = ["runToken"]
        job: str
        runToken: str | None = None  # OpenLineage facets are camelCase
        epoch: int | None = None
        startFrom: str | None = None
        checkpointId: str | None = None  # externalized checkpoint (or latest)
        savepointId: str | None = None
        lastCommittedSeq: int | None = None
        state: str | None = None

    @define
    class StreamkeeperSavepointFacet(RunFacet):
        """A savepoint the job took on a savepoint or stop command."""

        job: str
        savepointId: str | None = None
        format: str | None = None
        storage: str | None = None
        command: str | None = None  # savepoint | stop
        commandId: str | None = None
        seq: int | None = None
        batchId: int | None = None

    @define
    class StreamkeeperUpgradeFacet(RunFacet):
        """A blue-green upgrade, as its record stands when the task ends."""

        _additional_skip_redact: ClassVar[list[str]] = ["blueRunToken", "greenRunToken"]
        job: str
        upgradeId: str
        phase: str
        reason: str | None = None
        blueRunToken: str | None = None
        greenRunToken: str | None = None
        greenJob: str | None = None  # the shadow run's job
        handoverSavepointId: str | None = None
        handoverSeq: int | None = None
        gapSeconds: float | None = None


RUN_FACET = "streamkeeper_run"
SAVEPOINT_FACET = "streamkeeper_savepoint"
UPGRADE_FACET = "streamkeeper_upgrade"
PARENT_PREFIX = "spark.openlineage.parent"
ROOT_PARENT_PREFIX = "spark.openlineage.rootParent"


def available() -> bool:
    """Is the openlineage provider installed (so the listener can use what we return)?"""
    if not CLIENT:
        return False
    try:
        import airflow.providers.openlineage.extractors  # noqa: F401
    except ImportError:
        return False
    return True


# -- datasets -----------------------------------------------------------------------------


def location_name(location: str, base: str | None = None) -> tuple[str, str]:
    """A storage location as an OpenLineage (namespace, name).

    Args:
        location: `s3://bucket/key`, `file:///path` or a local path.
        base: the folder a relative local path is below (default: the current one).

    Returns:
        `("s3://bucket", "key")`, or `("file", "/absolute/path")`.
    """
    if "://" not in location:
        path = Path(base or ".", location) if not Path(location).is_absolute() else Path(location)
        return "file", str(path.resolve())
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return "file", parsed.path
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path.strip("/")


def source_name(source: SourceSpec, base: str | None = None) -> tuple[str, str] | None:
    """The job's source as an OpenLineage (namespace, name); None for generated rows.

    Args:
        source: the spec's source (with the launch's overrides).
        base: the driver's working directory, for a relative folder.
    """
    if source.type == "file" and source.path:
        return location_name(source.path, base)
    if source.type == "delta" and source.table:
        return location_name(source.table, base)
    if source.type == "nats" and source.url and source.stream:
        server = urlparse(source.url)
        name = f"{source.stream}/{source.subject}" if source.subject else source.stream
        return f"nats://{server.hostname}:{server.port or 4222}", name
    return None


def sink_names(spec: JobSpec, root: str) -> dict[str, tuple[str, str]]:
    """Each sink's table as an OpenLineage (namespace, name), by sink name.

    Args:
        spec: the job's spec.
        root: the storage root the job runs on (the connection's), resolved.
    """
    from streamkeeper.storage.location import join_under

    return {sink.name: location_name(join_under(root, sink.table_path)) for sink in spec.sinks}


def job_lineage(
    spec: JobSpec | None,
    root: str = "",
    *,
    workdir: str | None = None,
    run_facets: dict[str, Any] | None = None,
) -> Any:
    """An `OperatorLineage` of the job's source (input) and tables (outputs), with
    `run_facets`; None without the openlineage provider.

    Args:
        spec: the job's spec with the launch's overrides (None: facets only).
        root: the storage root of its tables (with a spec).
        workdir: the driver's working directory (relative source folders).
        run_facets: from `run_facet`, `savepoint_facet` or `upgrade_facet`.
    """
    if not available():
        return None
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset

    inputs, outputs = [], []
    if spec is not None:
        source = source_name(spec.source, workdir)
        inputs = [] if source is None else [Dataset(namespace=source[0], name=source[1])]
        outputs = [Dataset(namespace=ns, name=name) for ns, name in sink_names(spec, root).values()]
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets=dict(run_facets or {}))


# -- run facets ---------------------------------------------------------------------------


def run_facet(
    job: str,
    started: dict[str, Any] | None,
    *,
    start_from: str | None = None,
    checkpoint_id: Any = None,
    savepoint_id: Any = None,
) -> dict[str, Any]:
    """`{"streamkeeper_run": ...}` of a start, from its trigger's event; {} without one
    (or without the provider).

    Args:
        started: the event the start's trigger resumed it with (`run_token`, `status_report`).
        start_from, checkpoint_id, savepoint_id: how the start asked the job to start
            (`checkpoint_id` "latest": the newest externalized checkpoint).
    """
    if not CLIENT or not started:
        return {}
    status = started.get("status_report") or {}
    runner = status.get("runner") or {}
    return {
        RUN_FACET: StreamkeeperRunFacet(
            job=job,
            runToken=started.get("run_token") or runner.get("run_token"),
            epoch=runner.get("epoch"),
            startFrom=start_from,
            checkpointId=None if checkpoint_id is None else str(checkpoint_id),
            savepointId=None if savepoint_id is None else str(savepoint_id),
            lastCommittedSeq=status.get("last_committed_seq"),
            state=status.get("state"),
        )
    }


def savepoint_facet(job: str, kind: str, result: dict[str, Any] | None) -> dict[str, Any]:
    """`{"streamkeeper_savepoint": ...}` of a command's result that names a savepoint; {}
    when it names none (a cancel, a stop without one) or without the provider.

    Args:
        kind: the command (savepoint, stop).
        result: the event the command's trigger (or quick wait) completed with.
    """
    if not CLIENT or not result or not result.get("savepoint_id"):
        return {}
    answer = result.get("result") or {}
    details = answer.get("details") or {}
    return {
        SAVEPOINT_FACET: StreamkeeperSavepointFacet(
            job=job,
            savepointId=str(result["savepoint_id"]),
            format=details.get("format"),
            storage=details.get("storage"),
            command=kind,
            commandId=result.get("command_id"),
            seq=details.get("seq"),
            batchId=details.get("batch_id"),
        )
    }


def upgrade_facet(record: Any) -> dict[str, Any]:
    """`{"streamkeeper_upgrade": ...}` of an upgrade record; {} without one (or the provider).

    Args:
        record: a `streamkeeper.upgrade.record.UpgradeRecord`.
    """
    if not CLIENT or record is None:
        return {}
    handover = record.handover or {}
    return {
        UPGRADE_FACET: StreamkeeperUpgradeFacet(
            job=record.job,
            upgradeId=record.id,
            phase=record.phase,
            reason=record.reason,
            blueRunToken=record.blue.get("run_token"),
            greenRunToken=record.green.get("run_token"),
            greenJob=record.green.get("shadow_job"),
            handoverSavepointId=handover.get("blue_savepoint"),
            handoverSeq=handover.get("seq"),
            gapSeconds=handover.get("gap_s"),
        )
    }


# -- parent run ---------------------------------------------------------------------------


def inject_parent_job_info_default() -> bool:
    """`[openlineage] spark_inject_parent_job_info`, the Spark provider's switch (False
    without the provider)."""
    if not available():
        return False
    from airflow.providers.openlineage import conf

    return conf.spark_inject_parent_job_info()


def parent_run_spark_conf(context: Any, spark_conf: dict[str, str]) -> dict[str, str]:
    """The Spark properties naming this task's OpenLineage run as the driver's parent, as
    the Spark provider injects them; {} when OpenLineage is off or absent, or when the
    spec's own `spark.conf` already names a parent (it is kept, as the provider keeps it).

    Args:
        context: the task's context.
        spark_conf: the spec's `spark.conf`.
    """
    if not available():
        return {}
    from airflow.providers.openlineage import conf

    if conf.is_disabled():
        return {}
    from airflow.providers.openlineage.utils.spark import (
        inject_parent_job_information_into_spark_properties,
    )

    injected = inject_parent_job_information_into_spark_properties(dict(spark_conf), context)
    return {
        str(key): str(value)
        for key, value in injected.items()
        if str(key).startswith((PARENT_PREFIX, ROOT_PARENT_PREFIX)) and key not in spark_conf
    }
