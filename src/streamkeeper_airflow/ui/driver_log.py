"""The driver's log as the operations page serves it (the task pages' *Driver log* link).

Where the log is comes from the job's launch record (`jobs/{job}/launch.json`), which is
read from storage: whatever can write there must not make the page read another file.
So the page reads a log only when the record names a file of this host (its host name)
inside the drivers' log folder, `{[streamkeeper] workdir}/.streamkeeper/logs/`, where
both launchers write (symlinks and `..` resolved first), ending in `.log`. Anything else
is answered with where the log is, never with a file's content. Only the tail is sent
(`MAX_BYTES`), with the connection's secrets masked like every text the page shows.

A driver on another host (a gateway, a pod) ships the tail of its own log to the control
plane (`drivers/{token}.log.json`, streamkeeper/lineage/driver_beat.py): that is served
instead, by the record's run token (a key, never a path), saying when it was shipped.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamkeeper.storage.objects import ObjectStore

MAX_BYTES = 256 * 1024
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")  # the CLI's --run-token
LOG_FOLDER = Path(".streamkeeper") / "logs"


@dataclass(frozen=True)
class DriverLog:
    """The tail of the log (None when it cannot be read here) and where it is."""

    text: str | None
    path: str | None
    host: str | None
    message: str
    truncated: bool = False


def logs_folder(workdir: str) -> Path:
    """Where the launchers write drivers' logs below the drivers' working directory."""
    return (Path(workdir) / LOG_FOLDER).resolve()


def read_driver_log(
    store: ObjectStore, job: str, folder: Path, host: str | None = None
) -> DriverLog:
    """The latest launch's driver log, if it is a log file of this host in `folder`."""
    from streamkeeper_airflow.starts import latest_launch

    record = latest_launch(store, job)
    if record is None or not record.log:
        return DriverLog(None, None, None, f"no driver of {job} was launched through Airflow")
    here = host or socket.gethostname()
    where = f"{record.log} on host {record.host}"
    if record.host != here:
        return _shipped(store, record.token, record.log, record.host, where)
    path = Path(os.path.realpath(record.log))
    if path.suffix != ".log" or not path.is_relative_to(folder.resolve()):
        return DriverLog(
            None,
            record.log,
            record.host,
            f"the launch record names {record.log!r}, outside the drivers' log folder "
            f"{folder}: not shown (set [streamkeeper] workdir to the drivers' one)",
        )
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - MAX_BYTES))
            tail = log.read(MAX_BYTES)
    except FileNotFoundError:
        return _shipped(store, record.token, record.log, record.host, f"no file {where}")
    return DriverLog(
        tail.decode("utf-8", errors="replace"),
        record.log,
        record.host,
        f"the last {len(tail)} bytes of {where}",
        truncated=size > MAX_BYTES,
    )


def _shipped(
    store: ObjectStore, token: str, path: str | None, host: str | None, where: str
) -> DriverLog:
    """The tail the driver shipped to the control plane, or why there is none."""
    import time

    from streamkeeper.lineage.driver_beat import log_key

    shipped = store.read_json(log_key(token)) if _TOKEN.fullmatch(token) else None
    text = None if shipped is None else shipped.get("text")
    if not isinstance(text, str):
        return DriverLog(None, path, host, f"the driver's log is {where}; it shipped none")
    text = text[-MAX_BYTES:]
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(shipped.get("time", 0))))
    return DriverLog(
        text,
        path,
        host,
        f"the last {len(text)} characters of {where}, as the driver shipped them at {at}",
        truncated=bool(shipped.get("truncated")),
    )
