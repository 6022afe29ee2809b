"""The SSH launcher's scripts, run by a local `sh -s` as the gateway runs them: odd values
survive the quoting exactly, inherited variables are dropped, the probe reads a login
shell's environment, and spark_submit mode detaches and prints the pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamkeeper_airflow.errors import LaunchError
from streamkeeper_airflow.launchers.spark_submit import DRIVER_ENTRY
from streamkeeper_airflow.launchers.ssh import (
    PROBE_MARK,
    environment_lines,
    probe_script,
    run_script,
    submit_script,
)

ODD = {
    "AWS_SECRET_ACCESS_KEY": 'it\'s a "secret" with $HOME, `id`, $(id) and \\ backslash',
    "AWS_SESSION_TOKEN": "line one\nline two\n\n  indented; exit 1 &",
    "STREAMKEEPER_EMPTY": "",
    "STREAMKEEPER_DASH": "-n -e",
    "STREAMKEEPER_GLOB": "* ? [a-z] ~ {a,b}",
    "LANG": "C.UTF-8",
    "STREAMKEEPER_UNICODE": "grüße ✓",
}
DUMP = "import json, os, sys; print(json.dumps({'env': dict(os.environ), 'argv': sys.argv[1:], 'cwd': os.getcwd()}))"  # noqa: E501
SHELL_SET = {"PWD", "OLDPWD", "SHLVL", "_"}  # what sh itself sets for its children


def sh(
    script: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-s"], input=script, capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )


def test_odd_values_reach_the_program_exactly_and_nothing_else_does(tmp_path: Path) -> None:
    env = {**ODD, "PATH": os.environ["PATH"]}
    args = ["--set", "a=it's $x", "line\nbreak", "", "*"]
    workdir = tmp_path / "a dir with 'quotes' and $dollar"
    inherited = {"PATH": os.environ["PATH"], "SSH_AUTH_SOCK": "/tmp/agent", "MAIL": "/var/mail"}
    done = sh(run_script(env, str(workdir), [sys.executable, "-c", DUMP, *args]), inherited)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert {k: v for k, v in seen["env"].items() if k not in SHELL_SET} == env
    assert seen["argv"] == args and seen["cwd"] == str(workdir)


def test_the_script_is_read_whole_before_the_program_reads_stdin(tmp_path: Path) -> None:
    # A program reading stdin must not eat the script (the block's stdin is /dev/null).
    script = run_script({"PATH": os.environ["PATH"]}, str(tmp_path), ["cat"])
    done = sh(script + "echo after-the-block\n")
    assert done.returncode == 0 and done.stdout == ""


def test_names_a_shell_cannot_export_are_refused() -> None:
    with pytest.raises(LaunchError, match="'BAD-NAME'.*cannot be exported"):
        environment_lines({"BAD-NAME": "x", "OK": "y"})
    with pytest.raises(LaunchError, match=r"'A=B'"):
        environment_lines({"A=B": "x"})


def test_the_probe_reads_the_login_shells_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text(
        "export SPARK_HOME=/opt/spark-from-profile\n"
        "export UNRELATED_SECRET=never-returned\n"
        "export PYTHONPATH=lib:/abs\n"
        "echo 'a chatty profile'\n"
    )
    env = {"HOME": str(home), "SHELL": "/bin/sh", "PATH": os.environ["PATH"]}
    done = sh(probe_script(sys.executable), env, cwd=home)  # sshd starts sessions in HOME
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith(PROBE_MARK)]
    found = json.loads(line[len(PROBE_MARK) :])
    assert found["env"]["SPARK_HOME"] == "/opt/spark-from-profile"
    assert "UNRELATED_SECRET" not in found["env"]
    assert found["env"]["PYTHONPATH"] == f"{home}/lib:/abs"  # anchored where the shell began
    assert found["streamkeeper"] is True and found["host"] == os.uname().nodename


def test_spark_submit_mode_detaches_and_prints_the_pid(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "spark-submit"
    fake.parent.mkdir()
    fake.write_text(
        '#!/bin/sh\necho "submitted: $*"\necho "key=$AWS_SECRET_ACCESS_KEY"\nsleep 60\n'
    )
    fake.chmod(0o755)
    workdir = tmp_path / "work"
    env = {"PATH": f"{fake.parent}:{os.environ['PATH']}", **ODD}
    script = submit_script(
        env, str(workdir), ["--master", "local[1]", "a b"], spark_submit=None, python="/x/python",
        job="keyed-totals",
    )  # fmt: skip
    done = sh(script)
    assert done.returncode == 0, done.stderr
    started = json.loads(done.stdout.strip().splitlines()[-1])
    pid, log = started["pid"], Path(started["log"])
    try:
        assert started["job"] == "keyed-totals"
        assert log == workdir / ".streamkeeper" / "logs" / "keyed-totals.spark-submit.log"
        # A session of its own (survives the SSH session). setsid runs in the background
        # child just after the script printed its pid, so give it a moment to get there.
        deadline = time.monotonic() + 10
        while os.getsid(pid) != pid:
            assert time.monotonic() < deadline, f"sid {os.getsid(pid)} != pid {pid}"
            time.sleep(0.02)
        entry = workdir / ".streamkeeper" / "airflow" / "streamkeeper_driver.py"
        assert entry.read_text() == DRIVER_ENTRY
        deadline = time.monotonic() + 10
        while "key=" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "spark-submit wrote nothing"
            time.sleep(0.05)
        assert "submitted: --master local[1] a b" in log.read_text()
        assert f"key={ODD['AWS_SECRET_ACCESS_KEY']}" in log.read_text()
        assert Path(f"/proc/{pid}/cmdline").read_bytes().count(b"secret") == 0
    finally:
        os.kill(pid, signal.SIGKILL)


def test_spark_submit_mode_says_when_spark_submit_is_missing(tmp_path: Path) -> None:
    script = submit_script(
        {"PATH": "/usr/bin:/bin"}, str(tmp_path), [], spark_submit=None, python="/x/python",
        job="keyed-totals",
    )  # fmt: skip
    done = sh(script)
    assert done.returncode == 127 and "set remote_spark_submit" in done.stderr
