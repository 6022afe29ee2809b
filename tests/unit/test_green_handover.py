"""Green's handover does its read-only preparation before it asks blue to stop.

The gap in live output runs from blue's stop to green's first commit, so whatever green
can do without blue's stop savepoint (a canonical restore's bootstrap batch, the query's
planned operators that a native restore's topology check reads) is done first. These
tests pin that order with stand-ins for the runner and blue's stop; the real handover
runs in tests/integration/test_upgrade.py and tests/airflow.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from streamkeeper.runtime.runner import JobRunner, RunOptions
from streamkeeper.spec import load_spec
from streamkeeper.upgrade import green
from tests.conftest import SAMPLE_SPEC


class _Runner:
    """Records what the handover asks of the live run's runner, in order."""

    def __init__(self, calls: list[str], spec: Any, options: RunOptions) -> None:
        self.calls = calls
        self.options = options

    def warm_up(self) -> None:
        self.calls.append("warm_up")

    def prepare_canonical_restore(self, work: Path) -> None:
        self.calls.append("prepare_canonical_restore")

    def planned_operators(self) -> list[Any]:
        self.calls.append("planned_operators")
        return []

    def run(self) -> str:
        self.calls.append(f"run from {self.options.from_savepoint}")
        return "ran"

    def discard_prepared(self) -> None:
        self.calls.append("discard_prepared")


def _hand_over(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fmt: str) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(green, "JobRunner", lambda spec, options: _Runner(calls, spec, options))
    monkeypatch.setattr(green, "StreamkeeperClient", lambda root: object())

    def stop_blue(*_args: Any, **_kwargs: Any) -> Any:
        calls.append("stop_blue")
        return SimpleNamespace(id="sp-1")

    monkeypatch.setattr(green, "stop_blue", stop_blue)
    records = SimpleNamespace(advance=lambda *args: calls.append("handing_over"))
    record = SimpleNamespace(id="up-1", green={"format": fmt})
    spec = load_spec(SAMPLE_SPEC, {"storage.root": str(tmp_path / "data")})
    options = green.GreenOptions(upgrade_id="up-1", spec_dir=SAMPLE_SPEC.parent)
    result = green._hand_over(
        spec,
        options,
        records,
        record,
        tmp_path / "blue",
        tmp_path / "live",  # type: ignore[arg-type]
    )
    assert result == "ran"
    return calls


@pytest.mark.parametrize(
    ("fmt", "prepared"),
    [("native", "planned_operators"), ("canonical", "prepare_canonical_restore")],
    ids=["native-plans-the-operators", "canonical-runs-the-bootstrap"],
)
def test_the_handover_prepares_before_blue_stops(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fmt: str, prepared: str
) -> None:
    calls = _hand_over(monkeypatch, tmp_path, fmt)
    assert calls == [
        "handing_over",
        "warm_up",
        prepared,
        "stop_blue",
        "run from sp-1",
        "discard_prepared",
    ]


def test_the_runner_plans_its_operators_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from streamkeeper.snapshots import state_metadata

    explained: list[tuple[Any, Any]] = []

    def planned(spark: Any, output: Any) -> list[str]:
        explained.append((spark, output))
        return ["aggregate"]

    monkeypatch.setattr(state_metadata, "planned_operators", planned)
    spec = load_spec(SAMPLE_SPEC, {"storage.root": str(tmp_path / "data")})
    runner = JobRunner(spec, RunOptions(spec_dir=SAMPLE_SPEC.parent))
    monkeypatch.setattr(runner, "warm_up", lambda: ("spark", "output", {}))
    assert runner.planned_operators() == ["aggregate"]
    assert runner.planned_operators() == ["aggregate"]
    assert explained == [("spark", "output")]  # explained once, of the warmed-up output
