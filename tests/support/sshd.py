"""A real OpenSSH server on 127.0.0.1 for tests: Debian's sshd, key authentication only.

    server = start_sshd(folder, set_env={"SPARK_LOCAL_IP": "127.0.0.1"})
    server.connection_json()   # an `AIRFLOW_CONN_*` value of an SSH connection to it
    server.stop()              # stops sshd and removes its keys and config

It runs as the current user (root here: `PermitRootLogin prohibit-password`), with its own
host key, client key and authorized_keys in `folder`, so it touches nothing of the
machine's own SSH setup but `/run/sshd`, which sshd's privilege separation needs.
`set_env` is what the gateway's administrator would put in its login environment.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = "ssh-keygen"


def ensure_openssh_server() -> None:
    """Debian's openssh-server, installed as infra/setup.sh does if it is missing."""
    if SSHD.is_file():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(f"{SSHD} is missing; install it: apt-get install openssh-server")
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "openssh-server"],
    ):
        subprocess.run(command, check=True, capture_output=True, timeout=900)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _keygen(path: Path) -> str:
    """A new ed25519 key pair at `path`; returns the public key line."""
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "streamkeeper-test", "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class Sshd:
    folder: Path
    port: int
    user: str
    client_key: Path
    host_key_line: str  # "ssh-ed25519 AAAA..." (the connection's host_key extra)
    process: subprocess.Popen[bytes]
    log: Path
    host: str = "127.0.0.1"
    stopped: bool = field(default=False)

    def connection_json(self, **extra: object) -> str:
        """An Airflow SSH connection to this server, checking its host key."""
        return json.dumps(
            {
                "conn_type": "ssh",
                "host": self.host,
                "port": self.port,
                "login": self.user,
                "extra": {
                    "key_file": str(self.client_key),
                    "host_key": self.host_key_line,
                    "look_for_keys": "false",  # only this key, never the user's own
                    **extra,
                },
            }
        )

    def stop(self, remove: bool = True) -> None:
        """Stop the listening sshd (sessions already open end with their commands)."""
        if not self.stopped:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self.stopped = True
        if remove:
            shutil.rmtree(self.folder, ignore_errors=True)


def _config(folder: Path, port: int, user: str, set_env: dict[str, str]) -> str:
    lines = [
        "ListenAddress 127.0.0.1",
        f"Port {port}",
        f"HostKey {folder / 'host_ed25519'}",
        f"PidFile {folder / 'sshd.pid'}",
        f"AuthorizedKeysFile {folder / 'authorized_keys'}",
        f"AllowUsers {user}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        # PAM's session modules (loginuid) fail in containers; keys need no PAM.
        "UsePAM no",
        # The files live under /tmp (world-writable): strict modes would refuse them.
        "StrictModes no",
        "PermitUserEnvironment no",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "AllowAgentForwarding no",
        "PrintMotd no",
        "LogLevel VERBOSE",
    ]
    if set_env:
        pairs = " ".join(f'"{k}={v}"' for k, v in sorted(set_env.items()))
        lines.append(f"SetEnv {pairs}")
    return "\n".join(lines) + "\n"


def start_sshd(folder: Path, set_env: dict[str, str] | None = None, timeout: float = 20) -> Sshd:
    """Start sshd on a free 127.0.0.1 port; return once it answers with its banner."""
    ensure_openssh_server()
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation's chroot
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    user = getpass.getuser()
    host_key_line = " ".join(_keygen(folder / "host_ed25519").split()[:2])
    client_public = _keygen(folder / "client_ed25519")
    (folder / "authorized_keys").write_text(client_public + "\n")
    port = free_port()
    config = folder / "sshd_config"
    config.write_text(_config(folder, port, user, dict(set_env or {})))
    log = folder / "sshd.log"
    check = subprocess.run(
        [str(SSHD), "-t", "-f", str(config)], capture_output=True, text=True, timeout=30
    )
    if check.returncode != 0:
        raise RuntimeError(f"sshd refused its test config: {check.stderr.strip()}")
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Sshd(folder, port, user, folder / "client_ed25519", host_key_line, process, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited ({process.returncode}): {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                if conn.recv(64).startswith(b"SSH-"):
                    return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"sshd did not answer on 127.0.0.1:{port} within {timeout} s")
