"""A throwaway PostgreSQL server on 127.0.0.1 from Debian's `postgresql` package.

For the production profile's test (Airflow's metadata database on Postgres, the
LocalExecutor running tasks side by side). `initdb` and `postgres` refuse to run as
root, so as root the server runs as the `postgres` user the package creates, with its
data folder (and socket) in a folder that user owns.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.components.process import HOST, LocalService, Stoppable, free_port, tcp_connects


def postgres_bin() -> Path | None:
    """The folder holding `initdb` and `postgres`, or None when PostgreSQL is absent."""
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(folder, "initdb").exists():
            return Path(folder)
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


@dataclass
class PostgresServer(Stoppable):
    """A running server with one database and its owner."""

    service: LocalService
    port: int
    database: str
    user: str
    password: str
    data_dir: Path

    @property
    def sqlalchemy_url(self) -> str:
        return (
            f"postgresql+psycopg2://{self.user}:{self.password}@{HOST}:{self.port}/{self.database}"
        )

    def connect(self, database: str | None = None) -> Any:
        """A psycopg2 connection (autocommit) to `database` (default: the one created)."""
        import psycopg2

        connection = psycopg2.connect(
            host=HOST,
            port=self.port,
            dbname=database or self.database,
            user=self.user,
            password=self.password,
        )
        connection.autocommit = True
        return connection

    def stop(self, grace: float = 15.0) -> None:
        self.service.stop(grace)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


def start_postgres(log: Path, database: str = "airflow") -> PostgresServer:
    """initdb a fresh cluster (password auth), start it on a free port, create `database`.

    Raises:
        RuntimeError: PostgreSQL is not installed (see `postgres_bin`).
    """
    binaries = postgres_bin()
    if binaries is None:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql")
    # Not below pytest's tmp_path: that is private to root, and the server runs as postgres.
    data_dir = Path(tempfile.mkdtemp(prefix="streamkeeper-pg-"))
    password = secrets.token_hex(12)
    (data_dir / "pwfile").write_text(password)
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(data_dir, owner.pw_uid, owner.pw_gid)
        os.chown(data_dir / "pwfile", owner.pw_uid, owner.pw_gid)
    cluster = data_dir / "cluster"
    subprocess.run(
        _as_server_user(
            [
                str(binaries / "initdb"),
                "-D",
                str(cluster),
                "-U",
                "airflow",
                "--auth=scram-sha-256",
                f"--pwfile={data_dir / 'pwfile'}",
                "--no-sync",
            ]
        ),
        check=True,
        capture_output=True,
    )
    port = free_port()
    argv = [
        str(binaries / "postgres"),
        "-D",
        str(cluster),
        "-c",
        f"listen_addresses={HOST}",
        "-c",
        f"port={port}",
        "-c",
        f"unix_socket_directories={data_dir}",
        "-c",
        "fsync=off",
    ]
    service = LocalService("postgres", _as_server_user(argv), log)
    service.start()
    server = PostgresServer(service, port, database, "airflow", password, data_dir)
    try:
        service.wait_until_ready(lambda: tcp_connects(port), timeout=60)
        with contextlib.closing(server.connect("postgres")) as connection:
            connection.cursor().execute(f'CREATE DATABASE "{database}"')
    except BaseException:
        server.stop()
        raise
    return server
