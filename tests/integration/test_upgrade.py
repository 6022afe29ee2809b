"""Blue-green upgrades of the running sample job, with real Spark drivers and local
storage: green's shadow run from blue's savepoint matches blue's output over the same
input; the handover stops blue at a batch boundary and green continues the lineage
(commit seq, live tables) exactly once; Delta RESTORE and a restart from blue's stop
savepoint roll it back exactly once. (A broken green, rejected by the comparison and the
quality gate with blue untouched: tests/airflow/test_upgrade_dags.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.keyed_totals.sample_events import expected_results
from streamkeeper.client import StreamkeeperClient
from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.runner import RunOptions
from streamkeeper.spec import JobSpec, load_spec
from streamkeeper.upgrade.record import UpgradeRecords
from streamkeeper.upgrade.rollback import restore_tables
from streamkeeper.upgrade.shadow import new_upgrade_id
from streamkeeper.upgrade.steps import (
    begin_upgrade,
    compare_with_blue,
    handover_gap,
    request_handover,
    savepoint_manifest,
    set_aside,
)
from tests.conftest import SAMPLE_SPEC
from tests.support.driver import driver_env
from tests.support.traffic import BackgroundRun, Feeder, check_changes, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

JOB = "keyed-totals"
V2_SPEC = SAMPLE_SPEC.parent / "versions" / "v2.yaml"


def _settings(tmp_path: Path, root: str) -> dict[str, object]:
    return {
        "source.path": str(tmp_path / "events"),
        "storage.root": root,
        "checkpoint.dir": str(tmp_path / "checkpoint"),
        "checkpoint.interval": "300ms",
        "spark.master": "local[2]",
        "spark.shuffle_partitions": 2,
    }


def _start_blue(tmp_path: Path, root: str) -> tuple[JobSpec, BackgroundRun]:
    spec = load_spec(SAMPLE_SPEC, _settings(tmp_path, root))
    run = BackgroundRun(spec, RunOptions(spec_dir=SAMPLE_SPEC.parent, command_poll_interval=0.2))
    run.start()
    return spec, run


def _launch_green(
    tmp_path: Path, root: str, upgrade_id: str, spec_path: Path, *sets: str
) -> subprocess.Popen:
    command = [sys.executable, "-m", "streamkeeper", "upgrade-green", str(spec_path)]
    command += ["--upgrade-id", upgrade_id, "--run-token", "green-token"]
    for key, value in _settings(tmp_path, root).items():
        command += ["--set", f"{key}={value}"]
    for setting in sets:
        command += ["--set", setting]
    log = open(tmp_path / f"green-{upgrade_id}.log", "wb")  # noqa: SIM115 - the child's
    return subprocess.Popen(command, env=driver_env(), stdout=log, stderr=subprocess.STDOUT)


def _state(client: StreamkeeperClient, job: str) -> str | None:
    try:
        return client.status(job).state
    except Exception:  # noqa: BLE001 - not started yet
        return None


def _committed(client: StreamkeeperClient, job: str, at_least: int) -> bool:
    try:
        head = client.status(job).head
    except Exception:  # noqa: BLE001 - not started yet
        return False
    return head is not None and head.seq >= at_least


def _shadow_committed(client: StreamkeeperClient, shadow: str, green: subprocess.Popen) -> bool:
    assert green.poll() is None, f"green's driver exited ({green.returncode}); see its log"
    return _committed(client, shadow, 3)


def _table(root: str, sink: str) -> list[dict]:
    return read_table_rows(str(Path(root) / "tables" / sink))


def _check_exact(root: str, files: list[Path]) -> None:
    totals, changes = expected_results(files)
    got = {r["key"]: (r["events"], r["total"]) for r in _table(root, "totals")}
    assert got == totals, "the live totals are not exactly the reference"
    rows = [(r["key"], r["events"], r["total"]) for r in _table(root, "changes")]
    check_changes(rows, files)
    assert sorted(rows) == changes, "the live changes are not exactly the reference"


def test_upgrade_hands_over_exactly_once_then_rolls_back(tmp_path: Path) -> None:
    root = str(tmp_path / "data")
    feeder = Feeder(tmp_path / "events", period=0.5, initial=3)
    feeder.start()
    spec, blue = _start_blue(tmp_path, root)
    client = StreamkeeperClient(root)
    wait_for(lambda: _committed(client, JOB, 3), 240, "blue's first commits")

    upgrade_id = new_upgrade_id()
    record = begin_upgrade(
        client, JOB, upgrade_id, green_spec_path=str(V2_SPEC), blue_spec_path=str(SAMPLE_SPEC)
    )
    assert record.phase == "shadow" and record.blue["savepoint"]
    assert (
        begin_upgrade(
            client, JOB, upgrade_id, green_spec_path=str(V2_SPEC), blue_spec_path=None
        ).blue["savepoint"]
        == record.blue["savepoint"]
    ), "a retried begin took a second savepoint"
    green = _launch_green(tmp_path, root, upgrade_id, V2_SPEC)
    shadow = record.green["shadow_job"]
    try:
        wait_for(lambda: _shadow_committed(client, shadow, green), 240, "green's shadow commits")
        keys = {"totals": ["key"], "changes": None, "means": ["key"]}
        comparison = wait_for_comparison(client, upgrade_id, keys)
        assert comparison.success, comparison.reason
        assert {s.sink for s in comparison.sinks} == {"totals", "changes"}
        assert all(s.green_rows > 0 for s in comparison.sinks)
        # The changelog declared by its key: equal too, whether or not the cuts differ.
        record = UpgradeRecords(client.store, JOB).read(upgrade_id)
        keyed = compare_with_blue(client, record, keys, {"changes": ["key"]})
        assert keyed.success, keyed.reason

        request_handover(client, JOB, upgrade_id)
        blue_result = blue.finish(timeout=240)
        assert blue_result.savepoint_id is not None, "blue did not stop with a savepoint"
        records = UpgradeRecords(client.store, JOB)
        wait_for(lambda: records.read(upgrade_id).phase == "live", 120, "green to go live")
        record = records.read(upgrade_id)
        assert record.handover["blue_savepoint"] == blue_result.savepoint_id
        wait_for(lambda: handover_gap(client, record), 240, "green's first live commit")
        gap = handover_gap(client, record)
        assert gap is not None
        assert gap.green_first_seq == record.handover["seq"] + 1, "the commit seq did not continue"
        assert client.status(JOB).runner.run_token == "green-token"
        wait_for(lambda: _committed(client, JOB, gap.green_first_seq + 2), 240, "green commits")
        means = _table(root, "means")
        assert means and all(r["mean"] is not None for r in means), "green's new table is empty"

        # Roll back: stop green, RESTORE the live tables to blue's stop savepoint, restart
        # blue (v1) from it; then feed more and check the output exactly once.
        stop = client.send_command(JOB, "stop", savepoint=False)
        assert client.wait_for_result(JOB, stop.id, timeout=240).ok
        assert green.wait(timeout=240) == 0
        manifest = savepoint_manifest(client, record.lineage, record.handover["blue_savepoint"])
        restored = restore_tables(client, JOB, manifest)
        assert {n: t["to"] for n, t in restored.tables.items()} == {
            n: t.version for n, t in manifest.tables.items()
        }
        got = {r["key"]: (r["events"], r["total"]) for r in _table(root, "totals")}
        at_savepoint = read_table_rows(
            str(Path(root) / "tables" / "totals"), version=manifest.tables["totals"].version
        )
        assert got == {r["key"]: (r["events"], r["total"]) for r in at_savepoint}
        pending = Path(root) / "jobs" / JOB / "rewind-pending.json"
        assert json.loads(pending.read_text())["savepoint"] == manifest.id  # until blue runs
        set_aside(tmp_path / "checkpoint", f"{upgrade_id}.green")
        blue_again = BackgroundRun(
            spec,
            RunOptions(
                spec_dir=SAMPLE_SPEC.parent,
                from_savepoint=manifest.id,  # the tables are at its versions: no rewind
                takeover=True,
                command_poll_interval=0.2,
            ),
        )
        blue_again.start()
        files = feeder.stop()
        wait_for(
            lambda: _caught_up(root, files), 300, "blue to process every file after the rollback"
        )
        assert not pending.exists()  # the start from the savepoint completed the rollback
        stop = client.send_command(JOB, "stop", savepoint=False)
        assert client.wait_for_result(JOB, stop.id, timeout=240).ok
        blue_again.finish(timeout=240)
        _check_exact(root, files)
    finally:
        feeder.stop()
        if green.poll() is None:
            green.kill()


def wait_for_comparison(client: StreamkeeperClient, upgrade_id: str, keys: dict) -> object:
    holder: dict[str, object] = {}

    def compared() -> bool:
        record = UpgradeRecords(client.store, JOB).read(upgrade_id)
        holder["c"] = comparison = compare_with_blue(client, record, keys)
        return comparison.position is not None

    wait_for(compared, 240, "a common input position of blue and green")
    return holder["c"]


def _caught_up(root: str, files: list[Path]) -> bool:
    totals, _ = expected_results(files)
    got = {r["key"]: (r["events"], r["total"]) for r in _table(root, "totals")}
    return got == totals
