"""The Delta log audit (tests/support/delta_audit.py) on real tables written through the
runtime's committer (delta-rs, local directory): clean logs pass, and each kind of damage
the fault run must catch is reported: a missing version, a deleted file, a file added
twice, an app transaction going backwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from streamkeeper.commit.tables import TableCommitter, TableTarget, ensure_table
from tests.support.delta_audit import audit_table, known_files
from tests.unit.test_delta_commit import SCHEMA, append_part

APP = "data:lin:totals"


@pytest.fixture
def target(tmp_path: Path) -> TableTarget:
    """A table at version 4: created, then three appends with seqs 1..3 (epoch 1)."""
    from streamkeeper.storage import Location

    target = TableTarget("totals", Location(str(tmp_path / "table")), APP, "fence:lin")
    ensure_table(target, SCHEMA)
    committer = TableCommitter(target, epoch=1)
    for seq in (1, 2, 3):
        committer.commit(
            append_part(target, f"sk-lin/{seq}/f.parquet", {"key": [f"k{seq}"], "total": [seq]}),
            seq,
        )
    return target


def _log(target: TableTarget) -> Path:
    return Path(target.location.uri) / "_delta_log"


def _commit(target: TableTarget, version: int) -> Path:
    return _log(target) / f"{version:020d}.json"


def _actions(target: TableTarget, version: int) -> list[dict]:
    return [json.loads(line) for line in _commit(target, version).read_text().splitlines()]


def _write_commit(target: TableTarget, version: int, actions: list[dict]) -> None:
    _commit(target, version).write_text("".join(json.dumps(a) + "\n" for a in actions))


def _add(target: TableTarget, version: int) -> dict:
    return next(a for a in _actions(target, version) if "add" in a)


def _info(operation: str) -> dict:
    return {"commitInfo": {"timestamp": 1, "operation": operation, "operationParameters": {}}}


def test_a_clean_log_has_no_problems(target: TableTarget) -> None:
    assert DeltaTable(target.location.uri).version() >= 3
    assert audit_table(target.location) == []
    assert audit_table(target.location.uri) == []  # a plain path works too
    assert {f"sk-lin/{s}/f.parquet" for s in (1, 2, 3)} <= known_files(target.location)


def test_an_expired_log_is_read_from_its_checkpoint(target: TableTarget) -> None:
    table = target.open()
    table.create_checkpoint()
    newest = table.version()
    for version in range(newest):
        _commit(target, version).unlink()
    assert audit_table(target.location) == []
    assert "sk-lin/1/f.parquet" in known_files(target.location)


def test_an_expired_log_without_its_checkpoint_cannot_be_read(target: TableTarget) -> None:
    _commit(target, 0).unlink()
    _commit(target, 1).unlink()
    problems = audit_table(target.location)
    assert any("starts at version 2 with no checkpoint" in p for p in problems), problems


def test_a_missing_version_is_reported(target: TableTarget) -> None:
    _commit(target, 2).unlink()
    problems = audit_table(target.location)
    assert any("missing from the log: version(s) 2" in p for p in problems), problems


def test_a_deleted_data_file_is_reported(target: TableTarget) -> None:
    (Path(target.location.uri) / "sk-lin" / "2" / "f.parquet").unlink()
    problems = audit_table(target.location)
    assert any("sk-lin/2/f.parquet, which does not exist" in p for p in problems), problems


def test_a_file_added_twice_is_reported(target: TableTarget) -> None:
    newest = target.open().version()
    _write_commit(target, newest + 1, [_info("WRITE"), _add(target, 2)])  # a blind retry
    problems = audit_table(target.location)
    assert any(f"version {newest + 1} adds" in p and "twice" in p for p in problems), problems


def test_a_removed_file_added_again_is_reported_unless_restored(target: TableTarget) -> None:
    table = target.open()
    newest = table.version()
    table.restore(newest - 1)  # removes seq 3's file
    assert audit_table(target.location) == []
    table = target.open()
    table.restore(newest)  # RESTORE re-adds it: legitimate
    assert audit_table(target.location) == []
    target.open().restore(newest - 1)
    again = target.open().version() + 1
    _write_commit(target, again, [_info("WRITE"), _add(target, newest)])
    problems = audit_table(target.location)
    assert any(f"version {again} (WRITE) adds" in p and "again" in p for p in problems), problems


def test_an_app_transaction_going_backwards_is_reported(target: TableTarget) -> None:
    data = target.open().to_pyarrow_dataset().to_table(use_threads=False).slice(0, 1)
    write_deltalake(
        target.location.uri,
        data,
        mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction(APP, 2)]),
    )
    newest = target.open().version()
    problems = audit_table(target.location)
    assert any(
        f"version {newest}: app transaction '{APP}' goes back from 3 to 2" in p for p in problems
    ), problems


def test_a_checkpoint_that_disagrees_with_the_log_is_reported(target: TableTarget) -> None:
    table = target.open()
    table.create_checkpoint()
    newest = table.version()
    # The commit of seq 2 loses its add: the replay no longer holds the file the
    # checkpoint does (and the file is then in no version the log shows).
    _write_commit(target, 2, [a for a in _actions(target, 2) if "add" not in a])
    problems = audit_table(target.location)
    assert any(f"checkpoint {newest} disagrees" in p for p in problems), problems


def test_a_remove_of_a_file_the_table_does_not_hold_is_reported(target: TableTarget) -> None:
    newest = target.open().version()
    remove = {
        "remove": {"path": "sk-lin/9/ghost.parquet", "deletionTimestamp": 1, "dataChange": True}
    }
    _write_commit(target, newest + 1, [_info("DELETE"), remove])
    problems = audit_table(target.location)
    assert any("removes sk-lin/9/ghost.parquet" in p for p in problems), problems


def test_a_leftover_temporary_commit_is_reported(target: TableTarget) -> None:
    (_log(target) / "_commit_0a1b2c.json.tmp").write_text("{}")
    problems = audit_table(target.location)
    assert any("temporary log entry" in p for p in problems), problems


def test_a_table_without_a_log_is_reported(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert audit_table(str(tmp_path / "empty")) == [
        "the table has no Delta log (no commit, no checkpoint)"
    ]
