"""Source positions: read from a Spark checkpoint, written into a restored one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamkeeper.errors import CheckpointRestoreError
from streamkeeper.state.positions import (
    SourcePositions,
    batch_input,
    check_sources,
    read_source_positions,
    write_restored_commit,
    write_restored_positions,
)

META = {"batchWatermarkMs": 5000, "batchTimestampMs": 123, "conf": {"a": "1"}}


def write(path: Path, *lines: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(["v1", *lines]))


def entry(name: str, batch: int, timestamp: int | None = None) -> str:
    stamp = batch if timestamp is None else timestamp  # files arrive in the order read
    return json.dumps({"path": f"file:///in/{name}", "timestamp": stamp, "batchId": batch})


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A file source (with a compacted log) and a rate source, batch 11 complete."""
    root = tmp_path / "ckpt"
    write(root / "offsets" / "11", json.dumps(META), '{"logOffset":11}', "42")
    write(root / "commits" / "11", '{"nextBatchWatermarkMs":7000}')
    write(root / "sources" / "0" / "9.compact", *(entry(f"f{i}", i) for i in range(10)))
    write(root / "sources" / "0" / "10", entry("f10", 10))
    write(root / "sources" / "0" / "11", entry("f11", 11))
    write(root / "sources" / "0" / "12", entry("f12", 12))  # a later batch: not ours
    write(root / "sources" / "1" / "0", "1795439837934")
    return root


def test_positions_of_a_completed_batch(checkpoint: Path) -> None:
    positions = read_source_positions(checkpoint, 11)
    assert positions.offsets == ['{"logOffset":11}', "42"]
    assert (positions.batch_watermark_ms, positions.next_watermark_ms) == (5000, 7000)
    files = [e["path"] for e in positions.logs[0]["entries"]]
    assert files == sorted(f"file:///in/f{i}" for i in range(12))
    assert positions.logs[1] == {"kind": "files", "files": {"0": "v1\n1795439837934"}}
    manifest = positions.to_manifest()
    assert SourcePositions.from_manifest(manifest["offsets"], manifest["log"]) == positions


def test_an_incomplete_batch_is_refused(checkpoint: Path) -> None:
    write(checkpoint / "offsets" / "12", json.dumps(META), '{"logOffset":12}', "43")
    with pytest.raises(CheckpointRestoreError, match="batch 12 .* not complete"):
        read_source_positions(checkpoint, 12)


def test_restored_positions_make_batch_one_the_savepoint(checkpoint: Path, tmp_path: Path) -> None:
    positions = read_source_positions(checkpoint, 11)
    restored = tmp_path / "restored"
    write(restored / "sources" / "0" / "0", entry("empty.json", 0))  # the bootstrap's input
    (restored / "sources" / "0" / ".0.crc").write_bytes(b"stale")
    bootstrap = [
        json.dumps({"batchWatermarkMs": 0, "conf": {"new": "x"}}),
        '{"logOffset":0}',
        '{"logOffset":0}',
    ]
    checked = check_sources(positions, ["file", "other"])
    write_restored_positions(restored, checked, bootstrap)
    write_restored_commit(restored, checked)

    # Batch 1 lists only what the savepoint's own batch read (Spark rebuilds batch 1's
    # DataFrame on resuming); every earlier file is under batch 0, so all are seen.
    earlier = logged(restored / "sources" / "0" / "0")
    last = logged(restored / "sources" / "0" / "1")
    assert [e["path"] for e in last] == ["file:///in/f11"]
    assert sorted(e["path"] for e in earlier) == sorted(f"file:///in/f{i}" for i in range(11))
    assert {e["batchId"] for e in earlier} == {0} and last[0]["batchId"] == 1
    assert not (restored / "sources" / "0" / ".0.crc").exists()
    assert (restored / "sources" / "1" / "0").read_text() == "v1\n1795439837934"
    first = (restored / "offsets" / "0").read_text().splitlines()
    second = (restored / "offsets" / "1").read_text().splitlines()
    assert first[2:] == ['{"logOffset": 0}', "42"]
    assert second[2:] == ['{"logOffset": 1}', "42"]
    assert json.loads(second[1]) == {
        "batchWatermarkMs": 5000,
        "batchTimestampMs": 123,
        "conf": {"new": "x"},
    }
    commit = (restored / "commits" / "1").read_text().splitlines()
    assert json.loads(commit[1]) == {"nextBatchWatermarkMs": 7000}


def test_the_newest_file_stays_in_the_restored_batch_even_if_read_earlier(
    checkpoint: Path, tmp_path: Path
) -> None:
    """`batch_input` (the commit marker's input position) reads the newest file of batch 1;
    a restore keeps that position even when the source did not read files in time order."""
    write(checkpoint / "sources" / "0" / "10", entry("late", 10, timestamp=99))
    positions = check_sources(read_source_positions(checkpoint, 11), ["file", "other"])
    restored = tmp_path / "restored"
    bootstrap = [json.dumps({"batchWatermarkMs": 0}), '{"logOffset":0}', '{"logOffset":0}']
    write_restored_positions(restored, positions, bootstrap)

    last = logged(restored / "sources" / "0" / "1")
    assert sorted(e["path"] for e in last) == ["file:///in/f11", "file:///in/late"]
    assert len(logged(restored / "sources" / "0" / "0")) == 10
    assert batch_input(restored, 1) == ["file:file:///in/late", "42"]


def logged(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    assert lines[0] == "v1"
    return [json.loads(line) for line in lines[1:]]


@pytest.mark.parametrize(
    ("kinds", "message"),
    [
        (["file"], "2 source"),
        (["other", "other"], "source 0 of the savepoint was a file source"),
        (["file", "file"], "source 1 of the savepoint was not a file source"),
    ],
)
def test_sources_that_do_not_match_are_refused(checkpoint: Path, kinds: list, message: str) -> None:
    with pytest.raises(CheckpointRestoreError, match=message):
        check_sources(read_source_positions(checkpoint, 11), kinds)


def test_without_positions_only_file_sources_start_from_the_beginning() -> None:
    assert SourcePositions.from_manifest(None, None) is None
    start = check_sources(None, ["file"])
    assert start.offsets == ['{"logOffset": -1}'] and start.logs[0]["entries"] == []
    with pytest.raises(CheckpointRestoreError, match="no source positions.*based_on"):
        check_sources(None, ["other"])
