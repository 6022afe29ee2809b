"""StreamkeeperHook: a job control plane (status, heartbeats, history, records, commands).

It wraps the pyspark-free `streamkeeper.client.StreamkeeperClient` and builds it from an
Airflow connection (see `streamkeeper_airflow.connection` for the format). Every call
runs under `secrets_hidden`, so an error that quotes a credential is re-raised redacted.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from streamkeeper_airflow.connection import CONN_TYPE, EXAMPLE_EXTRA, ConnectionSettings
from streamkeeper_airflow.errors import ConnectionConfigError
from streamkeeper_airflow.secrets import register_with_airflow, secrets_hidden

if TYPE_CHECKING:
    from streamkeeper.client import Checkpoint, JobRecord, StatusReport, StreamkeeperClient
    from streamkeeper.lineage.driver_beat import BeatReading
    from streamkeeper.storage import ObjectStore

DEFAULT_CONN_ID = "streamkeeper_default"


class StreamkeeperHook(BaseHook):
    """Reads (and, for commands, writes) the control plane of the jobs below a storage root.

    Args:
        streamkeeper_conn_id: the Airflow connection (type `streamkeeper`, or `aws`).
        root: the storage root; overrides the connection's extra `root`.
        settings: an already parsed connection (triggers fetch it asynchronously).
    """

    conn_name_attr = "streamkeeper_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONN_TYPE
    hook_name = "Streamkeeper"

    def __init__(
        self,
        streamkeeper_conn_id: str = DEFAULT_CONN_ID,
        *,
        root: str | None = None,
        settings: ConnectionSettings | None = None,
    ) -> None:
        super().__init__()
        self.streamkeeper_conn_id = streamkeeper_conn_id
        self._root = root or None
        self._settings = settings

    @classmethod
    async def for_trigger(cls, conn_id: str, root: str | None = None) -> StreamkeeperHook:
        """A hook whose connection was fetched without blocking the triggerer's event loop."""
        connection = await cls.aget_connection(conn_id)
        return cls(conn_id, root=root, settings=ConnectionSettings.from_connection(connection))

    @cached_property
    def settings(self) -> ConnectionSettings:
        settings = self._settings or ConnectionSettings.from_connection(
            self.get_connection(self.streamkeeper_conn_id)
        )
        register_with_airflow(settings.secrets)
        return settings

    @property
    def root(self) -> str:
        """The storage root URI (the operator's, else the connection's extra `root`)."""
        root = self._root or self.settings.root
        if not root:
            raise ConnectionConfigError(
                f"connection {self.streamkeeper_conn_id!r} has no storage root; set its extra "
                f"to {EXAMPLE_EXTRA} or pass root= to the operator"
            )
        return root

    @cached_property
    def client(self) -> StreamkeeperClient:
        from streamkeeper.client import StreamkeeperClient

        with self._hidden():
            return StreamkeeperClient(self.root, self.settings.s3_settings())

    def get_conn(self) -> StreamkeeperClient:
        return self.client

    @property
    def store(self) -> ObjectStore:
        """The root's object store, for the Airflow layer's own records (launches, restarts)."""
        return self.client.store

    def _hidden(self) -> Any:
        return secrets_hidden(self.settings.secrets)

    # -- reading -----------------------------------------------------------------------

    def jobs(self) -> list[str]:
        with self._hidden():
            return self.client.jobs()

    def status(
        self, job: str, *, missing_ok: bool = False, settled: bool = False
    ) -> StatusReport | None:
        """The job's status; None for a job that never ran if `missing_ok`.

        `settled`: for a decision that is not undone, a heartbeat lost only lately is
        waited out (StreamkeeperClient.settled_status).

        Raises:
            UnknownJobError: no such job and not `missing_ok` (names the jobs there are).
        """
        from streamkeeper.errors import UnknownJobError

        with self._hidden():
            try:
                return self.client.settled_status(job) if settled else self.client.status(job)
            except UnknownJobError:
                if missing_ok:
                    return None
                raise

    def driver_beat(self, token: str, now: float | None = None) -> BeatReading:
        """What the driver launched with run token `token` last said of itself
        (streamkeeper/lineage/driver_beat.py): booting, handed over, exited, or stale."""
        import time

        from streamkeeper.lineage.driver_beat import beat_key, read_beat

        with self._hidden():
            record = self.store.read_json(beat_key(token))
        return read_beat(record, time.time() if now is None else now)

    def job_record(self, job: str, *, missing_ok: bool = False) -> JobRecord | None:
        from streamkeeper.errors import UnknownJobError

        with self._hidden():
            try:
                return self.client.job_record(job)
            except UnknownJobError:
                if missing_ok:
                    return None
                raise

    def history(self, job: str, last: int | None = 20) -> list[Checkpoint]:
        with self._hidden():
            return self.client.history(job, last=last)

    def checkpoints_after(self, job: str, checkpoint_id: int) -> list[int]:
        """Ids of the checkpoints committed after `checkpoint_id` (-1: all), ascending."""
        with self._hidden():
            return self.client.checkpoints_after(job, checkpoint_id)

    def head_seq(self, job: str) -> int:
        """The id of the lineage's last committed checkpoint, -1 if none (or never ran)."""
        report = self.status(job, missing_ok=True)
        return -1 if report is None or report.head is None else report.head.seq

    # -- commands ----------------------------------------------------------------------

    def send_command(self, job: str, kind: str, *, command_id: str, **options: Any) -> str:
        """Send a savepoint, stop or cancel command; the same id sent again is one command.

        Returns:
            The command's id.
        """
        with self._hidden():
            return self.client.send_command(job, kind, command_id=command_id, **options).id

    def command_result(self, job: str, command_id: str) -> dict[str, Any] | None:
        """The command's result as JSON, None while the job has not answered."""
        with self._hidden():
            result = self.client.command_result(job, command_id)
        return None if result is None else result.to_json()

    # -- Airflow UI ----------------------------------------------------------------------

    def test_connection(self) -> tuple[bool, str]:
        """What the UI's Test button runs, and says it checked: the connection parses, its
        role (if any) is assumed, a small object is written and deleted below the root
        (what a driver's start-up probe does), and the jobs below it are listed."""
        from streamkeeper.storage.probe import probe

        checked: list[str] = []
        try:
            with self._hidden():
                where = self.settings.endpoint_url or (
                    "AWS" if self.root.startswith("s3://") else ""
                )
                checked.append(f"root {self.root}" + (f" at {where}" if where else ""))
                if self.settings.role_arn:
                    from streamkeeper.storage.credentials import signing_credentials

                    signing_credentials(self.client.location.s3)
                    checked.append(f"assumed role {self.settings.role_arn}")
                probe(self.client.location)
                checked.append("write and delete below it: ok")
                jobs = self.client.jobs()
        except Exception as error:  # noqa: BLE001 - reported to the UI, already redacted
            return False, "; ".join([*checked, f"failed: {type(error).__name__}: {error}"])
        listed = f"{len(jobs)} job(s)" + (f": {', '.join(jobs)}" if jobs else "")
        return True, "; ".join([*checked, listed])

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """For Airflow before 3.2; later ones read the provider info's declaration."""
        from streamkeeper_airflow.connection_form import ui_field_behaviour

        return ui_field_behaviour()
