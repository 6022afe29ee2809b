"""The SSH gateway launcher: the driver runs on a Spark gateway (edge) host, detached.

    launcher_for("ssh", ssh_conn_id="spark_gateway", remote_python="/opt/sk/bin/python")

A Python driver on a standalone master runs in client mode on a host of its own: the
gateway. Through Airflow's SSH connection (`SSHHook`) the launcher starts it there in
one of two ways (`mode`):

    run           `python -m streamkeeper run SPEC ... --detach` (the CLI starts the driver
                  in a new session and prints {"job", "pid", "log"});
    spark_submit  `setsid nohup spark-submit --master URL --deploy-mode client ... &`, as
                  spark_submit.py does on the worker, and the pid it got.

Either way the driver outlives the SSH session and the Airflow task, the launcher returns
at once, and the LaunchedDriver names the gateway as the gateway names itself, the pid and
the log there. From then on the driver is followed through the control plane only.

Credentials never reach a command line (`ps` shows command lines to every user of the
gateway): every command is `sh -s`, and the script it reads from stdin exports the
variables (values quoted with shlex.quote), enters the working directory and `exec`s.

The driver's environment is built as `driver_environment` builds it, but from the
gateway's environment, not the worker's: the worker's PATH, JAVA_HOME, VIRTUAL_ENV or
PYTHONPATH name paths of the worker and mean nothing (or something else) on another
host. So a first script asks the gateway's login shell (where its administrator sets
JAVA_HOME, SPARK_HOME, PATH) and `remote_python` for the variables the allow-list passes
(and AWS_*), its host name, and whether streamkeeper imports; `driver_environment` then
applies the usual rules to them with the connection's settings (`request.env`) on top.
The second script clears the SSH session's own variables (SSH_CONNECTION, an agent
socket, MAIL) and exports exactly that environment: the driver runs user code and gets
what a Spark driver needs, nothing more. Paths in the request (spec, root, checkpoint
directory, `remote_workdir`, default the request's workdir) must mean the same on the
gateway: deploy the jobs folder there at the same path, as Airflow's DAGs folder is.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

from streamkeeper_airflow import settings
from streamkeeper_airflow.errors import LaunchError
from streamkeeper_airflow.launchers import base
from streamkeeper_airflow.launchers.base import (
    LaunchedDriver,
    LaunchRequest,
    detached_driver,
    driver_environment,
)
from streamkeeper_airflow.secrets import redact

log = logging.getLogger(__name__)

Mode = Literal["run", "spark_submit"]
MODES: tuple[str, ...] = ("run", "spark_submit")
COMMAND = "sh -s"  # all a `ps` on the gateway ever shows of a launch
PROBE_MARK = "streamkeeper-gateway: "
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OUTPUT_LIMIT = 65536
_EOF_GRACE = 2.0  # after the exit status, for output still in flight
# Login shells that take `-l -c`; any other (or none) falls back to /bin/sh.
_LOGIN_SHELLS = "bash|dash|sh|zsh|ksh|mksh|ash"

# Run by remote_python on the gateway (any Python 3): the variables `driver_environment`
# might keep (the filter is a superset: it decides), PYTHONPATH anchored where the login
# shell started, and what the launch needs to know.
PROBE_CODE = """\
import fnmatch, importlib.util, json, os, socket, sys
names, prefixes, patterns = json.loads(sys.argv[1])
def wanted(k):
    return k in names or k.startswith(tuple(prefixes)) or any(
        fnmatch.fnmatchcase(k, p) for p in patterns)
env = {k: v for k, v in os.environ.items() if wanted(k)}
if env.get("PYTHONPATH"):
    env["PYTHONPATH"] = os.pathsep.join(
        os.path.abspath(e) if e else e for e in env["PYTHONPATH"].split(os.pathsep))
found = importlib.util.find_spec("streamkeeper") is not None
print(MARK + json.dumps({"host": socket.gethostname(), "env": env,
                         "python": sys.executable, "streamkeeper": found}))
""".replace("MARK", repr(PROBE_MARK))


@dataclass(frozen=True)
class Gateway:
    """What the gateway's login environment says about itself."""

    host: str
    env: dict[str, str]
    python: str  # remote_python's sys.executable
    streamkeeper: bool


@dataclass(frozen=True)
class Result:
    status: int
    stdout: str
    stderr: str


def probe_filter() -> list[list[str]]:
    """Names, prefixes and patterns the probe returns (`driver_environment` decides)."""
    names = [*base.DRIVER_ENV_NAMES, *base.AWS_CHAIN_NAMES]
    prefixes = [*base.DRIVER_ENV_PREFIXES, *base.AWS_CHAIN_PREFIXES, "AWS_"]
    return [names, prefixes, list(settings.driver_env())]


def probe_script(remote_python: str) -> str:
    """Asks the gateway's login shell to run PROBE_CODE with remote_python."""
    argv = [remote_python, "-c", PROBE_CODE, json.dumps(probe_filter())]
    return (
        "{\n"
        f'case "${{SHELL##*/}}" in {_LOGIN_SHELLS}) sk_shell=$SHELL ;;\n'
        "  *) sk_shell=/bin/sh ;;\nesac\n"
        # `exec "$@"` runs argv as given; the login shell only sets the environment up.
        f'exec "$sk_shell" -l -c \'exec "$@"\' streamkeeper-probe {_join(argv)}\n'
        "} </dev/null\n"
    )


def _join(argv: list[str]) -> str:
    return " ".join(shlex.quote(arg) for arg in argv)


def environment_lines(env: dict[str, str]) -> list[str]:
    """Shell lines that drop every inherited variable, then export exactly `env`.

    Raises:
        LaunchError: a name that is not a shell variable name (the value is not quoted).
    """
    bad = sorted(name for name in env if not _NAME.match(name))
    if bad:
        raise LaunchError(
            f"environment variable name(s) {', '.join(map(repr, bad))} cannot be exported by "
            "a shell; rename them (letters, digits and '_') in the connection or driver_env"
        )
    clear = (
        "for sk_name in $(env | sed -n 's/^\\([A-Za-z_][A-Za-z0-9_]*\\)=.*/\\1/p'); do\n"
        '  command unset "$sk_name" 2>/dev/null || :\n'
        "done"
    )
    return [clear, *(f"export {name}={shlex.quote(env[name])}" for name in sorted(env))]


def _enter(workdir: str) -> str:
    quoted = shlex.quote(workdir)
    return (
        f"mkdir -p {quoted} && cd {quoted} || "
        f"{{ echo {shlex.quote(f'error: cannot enter remote_workdir {workdir}')} >&2; exit 3; }}"
    )


def run_script(env: dict[str, str], workdir: str, argv: list[str]) -> str:
    """`mode: run`: the environment, the working directory, then `exec` the CLI."""
    lines = [*environment_lines(env), _enter(workdir), f"exec {_join(argv)}"]
    return "{\n" + "\n".join(lines) + "\n} </dev/null\n"


def submit_script(
    env: dict[str, str],
    workdir: str,
    argv: list[str],
    *,
    spark_submit: str | None,
    python: str,
    job: str,
) -> str:
    """`mode: spark_submit`: write the entry file, start spark-submit detached in a new
    session (`argv` without the program), print its pid as `run --detach` does.

    spark-submit is `spark_submit`, else the one beside remote_python (the pyspark wheel's,
    as spark_submit.py looks beside the worker's), else the PATH's."""
    from streamkeeper_airflow.launchers.spark_submit import DRIVER_ENTRY

    entry, log_file = _submit_paths(workdir, job)
    missing = "error: spark-submit not found on the gateway (set remote_spark_submit)"
    beside = str(PurePosixPath(python).parent)
    choose = (
        [f"sk_submit={shlex.quote(spark_submit)}"]
        if spark_submit
        else [
            f"sk_submit={shlex.quote(beside + '/spark-submit')}",
            '[ -x "$sk_submit" ] || sk_submit=spark-submit',
        ]
    )
    started = {"job": job, "log": log_file}
    lines = [
        *environment_lines(env),
        _enter(workdir),
        "mkdir -p .streamkeeper/airflow .streamkeeper/logs || exit 3",
        f"printf '%s' {shlex.quote(DRIVER_ENTRY)} > {shlex.quote(entry)} || exit 3",
        *choose,
        'command -v "$sk_submit" >/dev/null 2>&1 ||',
        f"  {{ echo {shlex.quote(missing)} >&2; exit 127; }}",
        # Not a process group leader (no job control here), so setsid execs in place: $!
        # is spark-submit's pid, which execs the JVM that runs the driver.
        f'setsid nohup "$sk_submit" {_join(argv)} >> {shlex.quote(log_file)} 2>&1 < /dev/null &',
        # The pid goes between the JSON's two halves: {"job": .., "log": .., "pid": N}.
        f'printf \'%s"pid": %s}}\\n\' {shlex.quote(json.dumps(started)[:-1] + ", ")} "$!"',
    ]
    return "{\n" + "\n".join(lines) + "\n} </dev/null\n"


def _submit_paths(workdir: str, job: str) -> tuple[str, str]:
    root = PurePosixPath(workdir) / ".streamkeeper"
    return (
        str(root / "airflow" / "streamkeeper_driver.py"),
        str(root / "logs" / f"{job}.spark-submit.log"),
    )


class SshGatewayLauncher:
    """Starts the driver on a gateway host through an Airflow SSH connection."""

    name = "ssh"

    def __init__(
        self,
        ssh_conn_id: str | None = None,
        remote_python: str = "python3",
        remote_workdir: str | None = None,
        mode: str = "run",
        remote_spark_submit: str | None = None,
        conf: dict[str, str] | None = None,
        connect_timeout: float = 30.0,
        connect_attempts: int = 3,
        command_timeout: float = 300.0,
    ) -> None:
        if not ssh_conn_id:
            raise ValueError(
                "the ssh launcher needs launcher_options ssh_conn_id: the Airflow SSH "
                "connection of the Spark gateway host (e.g. {'ssh_conn_id': 'spark_gateway'})"
            )
        if mode not in MODES:
            raise ValueError(f"ssh launcher mode {mode!r} is not one of {', '.join(MODES)}")
        if remote_workdir is not None and not remote_workdir.startswith("/"):
            raise ValueError(
                f"remote_workdir {remote_workdir!r} is not an absolute path; give the "
                "gateway's directory from its root, e.g. /var/lib/streamkeeper"
            )
        if float(connect_timeout) <= 0 or float(command_timeout) <= 0:
            raise ValueError("connect_timeout and command_timeout must be above 0 seconds")
        self.ssh_conn_id = ssh_conn_id
        self.remote_python = remote_python
        self.remote_workdir = remote_workdir
        self.mode: Mode = "run" if mode == "run" else "spark_submit"
        self.remote_spark_submit = remote_spark_submit
        self.conf = dict(conf or {})
        self.connect_timeout = float(connect_timeout)
        self.connect_attempts = max(1, int(connect_attempts))
        self.command_timeout = float(command_timeout)

    def launch(self, request: LaunchRequest) -> LaunchedDriver:
        secrets = list(request.env.values())  # as embedded.py: every value is masked
        hook = self._hook(secrets)
        secrets.append(hook.password or "")
        where = f"{hook.remote_host}:{hook.port}"
        client = self._connect(hook, where, secrets)
        try:
            gateway = self._probe(client, where, secrets)
            env = driver_environment(request, gateway.env)
            secrets += [env[k] for k in base.AWS_KEY_NAMES if k in env]  # the gateway's own
            script, shown = self.script(request, gateway, env)
            log.info(
                "starting job %s on gateway %s (%s): %s", request.job, gateway.host, where, shown
            )
            result = execute(client, script, self.command_timeout, where)
        finally:
            client.close()  # the driver runs on in its own session
        return self._launched(request, gateway, result, shown, secrets)

    def script(
        self, request: LaunchRequest, gateway: Gateway, env: dict[str, str]
    ) -> tuple[str, str]:
        """The launch script and its command as a log may show it (no credential)."""
        from streamkeeper_airflow.launchers.embedded import EmbeddedLauncher
        from streamkeeper_airflow.launchers.spark_submit import SparkSubmitLauncher

        workdir = self.remote_workdir or request.workdir
        if self.mode == "run":
            argv = EmbeddedLauncher(python=self.remote_python).command(request)
            return run_script(env, workdir, argv), _join(argv)
        env = {"PYSPARK_PYTHON": gateway.python, "PYSPARK_DRIVER_PYTHON": gateway.python, **env}
        submit = self.remote_spark_submit
        launcher = SparkSubmitLauncher(spark_submit=submit or "spark-submit", conf=self.conf)
        argv = launcher.command(request, _submit_paths(workdir, request.job)[0])[1:]
        shown = _join([submit or "spark-submit", *argv])
        script = submit_script(
            env, workdir, argv, spark_submit=submit, python=gateway.python, job=request.job
        )
        return script, shown

    # -- steps -----------------------------------------------------------------------------

    def _hook(self, secrets: list[str]) -> Any:
        try:
            from airflow.providers.ssh.hooks.ssh import SSHHook
        except ImportError:
            raise LaunchError(
                "the ssh launcher needs apache-airflow-providers-ssh on the Airflow workers: "
                "pip install 'airflow-provider-streamkeeper[ssh]'"
            ) from None
        try:
            return SSHHook(
                ssh_conn_id=self.ssh_conn_id,
                conn_timeout=self.connect_timeout,  # type: ignore[arg-type]
                conn_retry_attempts=self.connect_attempts,
            )
        except Exception as error:  # noqa: BLE001 - a missing or malformed connection
            raise LaunchError(
                f"SSH connection {self.ssh_conn_id!r} is unusable: {_said(error, secrets)}; "
                "define it (Admin > Connections, or AIRFLOW_CONN_"
                f"{self.ssh_conn_id.upper()}) with the gateway's host, port, login and key"
            ) from None

    def _connect(self, hook: Any, where: str, secrets: list[str]) -> Any:
        try:
            return hook.get_conn()
        except Exception as error:  # noqa: BLE001 - socket, auth, host key: all one fix
            raise LaunchError(
                f"could not reach the Spark gateway {where} (SSH connection "
                f"{self.ssh_conn_id!r}, user {hook.username!r}, {self.connect_attempts} "
                f"attempt(s)): {_said(error, secrets)}; check that sshd runs there and the "
                "connection's host, port, login, key and host_key"
            ) from None

    def _probe(self, client: Any, where: str, secrets: list[str]) -> Gateway:
        result = execute(client, probe_script(self.remote_python), self.command_timeout, where)
        line = next(
            (x for x in reversed(result.stdout.splitlines()) if x.startswith(PROBE_MARK)), None
        )
        fix = (
            "set launcher_options remote_python to the gateway's Python that has streamkeeper "
            "installed (pip install 'streamkeeper[spark]' there)"
        )
        if result.status != 0 or line is None:
            raise LaunchError(
                f"remote_python {self.remote_python!r} did not run on the gateway {where} "
                f"(exit {result.status}): {_tail(result, secrets)}; {fix}"
            )
        try:
            found = json.loads(line[len(PROBE_MARK) :])
            gateway = Gateway(
                str(found["host"]),
                {str(k): str(v) for k, v in found["env"].items()},
                str(found["python"]),
                bool(found["streamkeeper"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise LaunchError(
                f"the gateway {where} answered the probe with "
                f"{redact(line[:300], secrets)!r}; {fix}"
            ) from None
        if not gateway.streamkeeper:
            raise LaunchError(
                f"streamkeeper does not import in {gateway.python} on the gateway "
                f"{gateway.host} ({where}); {fix}"
            )
        return gateway

    def _launched(
        self,
        request: LaunchRequest,
        gateway: Gateway,
        result: Result,
        shown: str,
        secrets: list[str],
    ) -> LaunchedDriver:
        where = f"the gateway {gateway.host}"
        if result.status != 0:
            raise LaunchError(
                f"`{redact(shown[:300], secrets)}` on {where} refused to start job "
                f"{request.job!r} (exit {result.status}): {_tail(result, secrets)}; "
                f"{_fix(result.status)}"
            )
        started = detached_driver(
            result.stdout,
            request.job,
            secrets,
            f"the {self.mode} launch on {where}: check that remote_python runs streamkeeper",
        )
        pid = started["pid"]
        log.info("job %s: pid %s on %s, log %s", request.job, pid, gateway.host, started.get("log"))
        return LaunchedDriver(self.name, pid, gateway.host, None, started.get("log"))


def execute(client: Any, script: str, timeout: float, where: str) -> Result:
    """`sh -s` on the connection, reading `script` from stdin; its exit status and output.

    Raises:
        LaunchError: the session broke, or gave no exit status within `timeout` seconds.
    """
    try:
        return _execute(client, script, timeout)
    except LaunchError as error:
        raise LaunchError(f"on the gateway {where}: {error}") from None
    except Exception as error:  # noqa: BLE001 - paramiko's and the socket's: one fix
        raise LaunchError(
            f"the SSH session to the gateway {where} broke: {type(error).__name__}: {error}; "
            "check the gateway's sshd (MaxSessions, its log) and the network, then retry"
        ) from None


def _execute(client: Any, script: str, timeout: float) -> Result:
    channel = client.get_transport().open_session(timeout=timeout)
    try:
        channel.exec_command(COMMAND)
        try:
            channel.sendall(script.encode())
            channel.shutdown_write()
        except OSError:  # the shell ended early: its status and output say why
            pass
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        exited_at: float | None = None
        while True:
            busy = _drain(channel, out, err)
            if channel.exit_status_ready():
                exited_at = exited_at or time.monotonic()
                if channel.eof_received or time.monotonic() - exited_at > _EOF_GRACE:
                    _drain(channel, out, err)
                    break
            elif time.monotonic() > deadline:
                raise LaunchError(
                    f"`{COMMAND}` gave no exit status within {timeout:.0f} s; "
                    "raise launcher_options command_timeout or look at the gateway's load"
                )
            if not busy:
                time.sleep(0.02)
        status = channel.recv_exit_status()
    finally:
        channel.close()
    return Result(status, out.decode(errors="replace"), err.decode(errors="replace"))


def _drain(channel: Any, out: bytearray, err: bytearray) -> bool:
    busy = False
    while channel.recv_ready():
        out += channel.recv(65536)
        busy = True
    while channel.recv_stderr_ready():
        err += channel.recv_stderr(65536)
        busy = True
    del out[:-_OUTPUT_LIMIT], err[:-_OUTPUT_LIMIT]
    return busy


def _fix(status: int) -> str:
    if status == 127:
        return "a program is not on the gateway's PATH: set remote_python / remote_spark_submit"
    if status == 126:
        return "a program on the gateway is not executable: check remote_python's permissions"
    if status == 3:
        return "set launcher_options remote_workdir to a directory the SSH user may write"
    return "fix what the driver's message says (a bad spec, a refused restore, a master)"


def _tail(result: Result, secrets: list[str]) -> str:
    text = (result.stderr.strip() or result.stdout.strip())[-2000:]
    return redact(text, secrets) or "(no output)"


def _said(error: BaseException, secrets: list[str]) -> str:
    return redact(f"{type(error).__name__}: {error}", secrets)
