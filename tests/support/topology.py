"""Several real hosts on one machine: Linux network namespaces on a private bridge.

Each host is a namespace `sk-<run>-<host>` with `lo` and one veth (`eth0`) holding one
address in a private /24; the veths' peers hang off a bridge in a namespace of its own
(`sk-<run>-net`), so nothing of a run lives in the root namespace except one uplink veth
(`sk<run>r`, address .254) through which the test process reaches every host. A service
started with `run` sees only its own host's network: binding it to the host's address
makes it reachable exactly where a real host's would be.

Needs root and iproute2 (`ip netns`). Namespaces separate networks only: every host
shares the machine's filesystem, pids, users and hostname (`socket.gethostname()` is
the same on every host), so nothing here may tell hosts apart by hostname, and a local
path written on one host is readable on all of them.

    topology = Topology(["s3", "gateway"]).up()
    try:
        server = topology.run("s3", ["weed", "mini", f"-ip={topology.address('s3')}"], log=...)
        topology.cut("gateway", "s3", seconds=30)   # a partition between two hosts
        topology.kill_host("s3")                    # SIGKILL everything on the host
    finally:
        topology.down()                             # also at exit, and for orphans later
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Self

PREFIX = "sk-"
OWNERS = Path(tempfile.gettempdir()) / "sk-topology"  # run id -> the pid that owns it
_SUBNETS = ipaddress.ip_network("10.213.0.0/16")
NOWHERE = "02:00:00:5e:00:00"  # a locally administered MAC no host of a run has


class TopologyError(RuntimeError):
    """A namespace, link or route could not be made."""


def unavailable_reason() -> str | None:
    """Why hosts cannot be built here (not root, no `ip netns`), or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` is unavailable: {probe.stderr.strip()}"
    return None


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise TopologyError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str


class Topology:
    """Hosts on one bridge; processes started on them; partitions; cleanup.

    Args:
        hosts: host names (letters, digits, '-'), e.g. ["s3", "broker", "gateway"].
        run_id: names this run's namespaces (keep it short: link names have 15
            characters) and picks its subnet; random by default.
    """

    def __init__(self, hosts: Sequence[str], run_id: str | None = None) -> None:
        self.run_id = run_id or secrets.token_hex(3)
        self.subnet = self._free_subnet()
        addresses = list(self.subnet.hosts())
        self.hosts = {
            name: Host(name, f"{PREFIX}{self.run_id}-{name}", str(addresses[9 + i]))
            for i, name in enumerate(hosts)
        }
        self.bridge_namespace = f"{PREFIX}{self.run_id}-net"
        self.uplink = f"sk{self.run_id}r"  # in the root namespace: <= 15 characters
        self.uplink_address = str(addresses[-1])
        self._processes: dict[str, list[subprocess.Popen[bytes]]] = {h: [] for h in hosts}
        self._severed: dict[tuple[str, str], bool] = {}  # pair -> silent
        self._up = False

    def _free_subnet(self) -> ipaddress.IPv4Network:
        """A /24 of 10.213/16 chosen by the run id, skipping ones the root namespace routes
        (another run's uplink)."""
        used = _ip("-4", "route", "show")
        subnets = list(_SUBNETS.subnets(new_prefix=24))
        first = zlib.crc32(self.run_id.encode())
        for step in range(len(subnets) - 2):
            subnet = subnets[(first + step) % (len(subnets) - 2) + 1]
            if f"{subnet.with_prefixlen} " not in used:
                return subnet
        raise TopologyError(f"no free /24 left in {_SUBNETS}")

    # -- lifecycle ------------------------------------------------------------------

    def up(self) -> Self:
        """Create the bridge, the hosts and the uplink. Undone by `down`, also at exit."""
        sweep_orphans()
        OWNERS.mkdir(parents=True, exist_ok=True)
        (OWNERS / self.run_id).write_text(str(os.getpid()))
        atexit.register(self.down)
        self._up = True
        try:
            self._make_namespace(self.bridge_namespace)
            net = self.bridge_namespace
            _ip("-n", net, "link", "add", "br0", "type", "bridge")
            _ip("-n", net, "link", "set", "br0", "up")
            for index, host in enumerate(self.hosts.values()):
                self._make_host(index, host)
            # The uplink: made in the root namespace, its peer moved onto the bridge.
            peer = f"sk{self.run_id}u"
            _ip("link", "add", self.uplink, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", net)
            _ip("-n", net, "link", "set", peer, "master", "br0", "up")
            _ip("addr", "add", f"{self.uplink_address}/24", "dev", self.uplink)
            _ip("link", "set", self.uplink, "up")
        except BaseException:
            self.down()
            raise
        return self

    def _make_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        _ip("-n", name, "link", "set", "lo", "up")  # 127.0.0.1 inside (Spark's Python workers)

    def _make_host(self, index: int, host: Host) -> None:
        self._make_namespace(host.namespace)
        # Made on the bridge's side with its peer straight in the host: no name in the root
        # namespace, so two runs never clash on a link name.
        net, port = self.bridge_namespace, f"h{index}"
        veth = ["type", "veth", "peer", "name", "eth0", "netns", host.namespace]
        _ip("-n", net, "link", "add", port, *veth)
        _ip("-n", net, "link", "set", port, "master", "br0", "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.namespace, "link", "set", "eth0", "up")

    def down(self) -> None:
        """Kill what runs on the hosts, delete every namespace and link made; idempotent."""
        if not self._up:
            return
        for name in self.hosts:
            with contextlib.suppress(Exception):
                self.kill_host(name)
        _teardown(self.run_id)
        self._up = False
        atexit.unregister(self.down)

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(self, *_: object) -> None:
        self.down()

    # -- hosts and processes ----------------------------------------------------------

    def address(self, host: str) -> str:
        return self.hosts[host].address

    def run(
        self,
        host: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        cwd: Path | None = None,
        stdout: int | IO[bytes] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `argv` on `host` (`ip netns exec`), in a new session, output to `log`."""
        command = ["ip", "netns", "exec", self.hosts[host].namespace, *map(str, argv)]
        out: int | IO[bytes] | None = stdout
        handle = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            out = handle = open(log, "ab")  # noqa: SIM115 - the child keeps its own copy
        try:
            process = subprocess.Popen(
                command,
                env=None if env is None else dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if log is not None else None,
                start_new_session=True,
            )
        finally:
            if handle is not None:
                handle.close()
        self._processes[host].append(process)
        return process

    def pids(self, host: str) -> set[int]:
        """Every process in the host's namespace (ours, and whatever they started)."""
        output = _ip("netns", "pids", self.hosts[host].namespace, check=False)
        return {int(p) for p in output.split()}

    def kill_host(self, host: str, timeout: float = 10.0) -> None:
        """SIGKILL every process on `host`: a machine losing power, as far as the others
        can tell (its connections drop and nothing it ran finishes)."""
        deadline = time.monotonic() + timeout
        while True:
            alive = {p.pid for p in self._processes[host] if p.poll() is None}
            victims = alive | self.pids(host)
            if not victims:
                break
            if time.monotonic() > deadline:
                raise TopologyError(f"processes on {host} survive SIGKILL: {sorted(victims)}")
            for pid in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)  # a fork in flight lands in the namespace: look again
        for process in self._processes[host]:
            process.wait()

    def listeners(self, host: str) -> list[str]:
        """The host's listening TCP sockets, as `address:port` (`ss -ltn`)."""
        namespace = self.hosts[host].namespace
        done = subprocess.run(
            ["ip", "netns", "exec", namespace, "ss", "-Hltn"], capture_output=True, text=True
        )
        return [line.split()[3] for line in done.stdout.splitlines() if line.strip()]

    # -- partitions ----------------------------------------------------------------------

    def sever(self, a: str, b: str, *, silent: bool = True) -> None:
        """Cut hosts `a` and `b` apart, until `heal`.

        silent (a real partition): each side resolves the other's address to a MAC no
        host has, so frames go out and vanish: connections hang until their timeouts,
        and recover by retransmission after the heal. Otherwise a blackhole route on
        each side: every send fails at once (like "no route to host").
        (This kernel has no tc classifiers and no iptables, hence neighbour entries.)
        """
        for here, there in ((a, b), (b, a)):
            namespace, address = self.hosts[here].namespace, self.address(there)
            if silent:
                entry = [address, "lladdr", NOWHERE, "dev", "eth0", "nud", "permanent"]
                _ip("-n", namespace, "neigh", "replace", *entry)
            else:
                _ip("-n", namespace, "route", "add", "blackhole", f"{address}/32")
        self._severed[(a, b)] = silent

    def heal(self, a: str, b: str) -> None:
        silent = self._severed.pop((a, b), None)
        for here, there in ((a, b), (b, a)):
            namespace, address = self.hosts[here].namespace, self.address(there)
            if silent:  # the next packet asks ARP again
                _ip("-n", namespace, "neigh", "del", address, "dev", "eth0", check=False)
            elif silent is not None:
                _ip("-n", namespace, "route", "del", "blackhole", f"{address}/32", check=False)

    def cut(self, a: str, b: str, seconds: float, *, silent: bool = True) -> None:
        """Partition `a` from `b` for `seconds`, then heal (blocks meanwhile)."""
        self.sever(a, b, silent=silent)
        try:
            time.sleep(seconds)
        finally:
            self.heal(a, b)


def _teardown(run_id: str) -> None:
    """Kill every process in a run's namespaces, then delete them and its uplink."""
    names = [n for n in _ip("netns", "list").split() if n.startswith(f"{PREFIX}{run_id}-")]
    for name in names:
        for _ in range(100):
            pids = _ip("netns", "pids", name, check=False).split()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.05)
    for name in names:  # a veth goes with its namespace, and takes its peer with it
        _ip("netns", "del", name, check=False)
    _ip("link", "del", f"sk{run_id}r", check=False)
    (OWNERS / run_id).unlink(missing_ok=True)


def sweep_orphans() -> list[str]:
    """Tear down runs whose owning process is gone (a test run killed before its cleanup).

    Returns:
        The run ids torn down.
    """
    swept = []
    for owner in OWNERS.glob("*") if OWNERS.is_dir() else []:
        with contextlib.suppress(ValueError, OSError):
            pid = int(owner.read_text())
            if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
                _teardown(owner.name)
                swept.append(owner.name)
    return swept


if __name__ == "__main__":  # `python -m tests.support.topology`: clean up after killed runs
    print("swept runs:", sweep_orphans() or "none")
