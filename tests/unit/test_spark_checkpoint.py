"""Spark's checkpoint directory as the runner sees it: unfinished log writes swept."""

from __future__ import annotations

from pathlib import Path

from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint


def test_only_the_unfinished_writes_of_the_logs_are_swept(tmp_path: Path) -> None:
    files = {
        "metadata": "kept",
        "offsets/0": "kept",
        "offsets/.0.crc": "kept",
        "offsets/.1.a1.tmp": "swept",
        "offsets/..1.a1.tmp.crc": "swept",
        "commits/0": "kept",
        "commits/.1.b2.tmp": "swept",
        "state/0/0/.1.delta.c3.tmp": "kept",  # the state store's own: not a log's
    }
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    removed = SparkCheckpoint(tmp_path).sweep_unfinished_writes()
    assert sorted(removed) == sorted(n for n, fate in files.items() if fate == "swept")
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(n for n, fate in files.items() if fate == "kept")
    assert SparkCheckpoint(tmp_path / "absent").sweep_unfinished_writes() == []
