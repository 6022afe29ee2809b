"""Every interleaving the deep profile found broken, replayed move for move.

`benchmarks/lifecycle_explore.py` prints a violation as Hypothesis's falsifying example,
with every draw labelled; saved under `found/`, it replays here without a seed or blob
(tests/support/lifecycle/replay.py) and must now end exact. Each also has a scene test
in test_lifecycle_holes.py that names what broke.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.lifecycle.replay import parse, replay

FOUND = sorted((Path(__file__).parent / "found").glob("*.txt"))


@pytest.mark.parametrize("report", FOUND, ids=[p.stem for p in FOUND])
def test_a_found_interleaving_now_ends_exact(report: Path) -> None:
    replay(report.read_text())  # raises the violation if it happens again


def test_a_report_parses_into_its_rules_and_draws() -> None:
    moves = parse(
        "Falsifying example:\n"
        "state = LifecycleMachine()\n"
        "state.setup(shared=False, batch_size=1, events=7)\n"
        "Draw 1 (actor): <takeover#1 at start>\n"
        "state.step(data=data(...), steps=11)\n"
        "state.run_to(data=data(...), point='idle', crash=True)\n"
        "state.teardown()\n"
    )
    assert [m.rule for m in moves] == ["setup", "step", "run_to", "teardown"]
    assert moves[0].kwargs == {"shared": False, "batch_size": 1, "events": 7}
    assert moves[1].kwargs == {"steps": 11}
    assert moves[1].draws == [("actor", "<takeover#1 at start>")]
    assert moves[2].kwargs == {"point": "idle", "crash": True} and moves[2].draws == []
