"""The lifecycle world is deterministic: the same moves give the same file names.

CI's property profile is derandomized, but file names, tokens and ids came from
`uuid4`, so listing orders (which decide what a sweep or a recovery meets first)
changed from run to run and its 25 examples passed or failed by luck. (Names that hold
a time or a content hash, and delta-rs's own, still vary; they are not compared.)
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.lifecycle import actors
from tests.support.lifecycle.scene import Scene

OUR_FILE_NAME = re.compile(r"e\d+-[0-9a-f]{32}\.parquet")  # commit/writer.py's


def _files_after_a_handover() -> list[str]:
    scene = Scene(batch_size=2, events=4)
    try:
        blue = scene.spawn("blue", actors.runner(scene.world, actors.RunnerPlan(batches=2)))
        scene.run(blue)
        scene.feed(4)
        green = scene.begin_handover(2)
        scene.run(green, until="awaiting_command_result")
        scene.run(blue)
        scene.run(green)
        assert green.error is None, green.error
        return sorted(
            str(path.relative_to(scene.base))
            for path in Path(scene.base).rglob("*")
            if path.is_file() and OUR_FILE_NAME.fullmatch(path.name)
        )
    finally:
        scene.close()


def test_the_same_moves_write_the_same_file_names() -> None:
    first = _files_after_a_handover()
    assert len(first) >= 4, first  # blue's two batches, green's, each to two tables
    assert _files_after_a_handover() == first
