"""The sensors' modes: deferrable as `[operators] default_deferrable` says, or as asked;
poke on request; never reschedule."""

from __future__ import annotations

import pytest

from streamkeeper_airflow.sensors.checkpoints import CheckpointProgressSensor, JobHealthySensor
from streamkeeper_airflow.sensors.commands import CommandResultSensor


@pytest.mark.parametrize(
    ("sensor", "extra"),
    [
        (CheckpointProgressSensor, {}),
        (JobHealthySensor, {"probation": 60}),
        (CommandResultSensor, {"command_id": "c-1"}),
    ],
)
def test_reschedule_mode_is_refused_with_the_fix(sensor: type, extra: dict) -> None:
    with pytest.raises(ValueError, match="mode='reschedule' is not supported.*deferrable=True"):
        sensor(task_id="wait", job="orders", mode="reschedule", deferrable=False, **extra)


def test_deferrable_and_poke_sensors_are_built() -> None:
    deferred = CheckpointProgressSensor(task_id="a", job="orders", deferrable=True)
    poking = CheckpointProgressSensor(task_id="b", job="orders", deferrable=False, mode="poke")
    assert deferred.deferrable and not poking.deferrable and poking.mode == "poke"


@pytest.mark.parametrize("configured", ["true", "false"])
def test_the_default_is_the_deployments_default_deferrable(
    configured: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", configured)
    for sensor in (
        CheckpointProgressSensor(task_id="a", job="orders"),
        JobHealthySensor(task_id="b", job="orders", probation=60),
        CommandResultSensor(task_id="c", job="orders", command_id="c-1"),
    ):
        assert sensor.deferrable is (configured == "true"), type(sensor).__name__


def test_without_the_setting_airflows_default_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raising=False)
    assert not CheckpointProgressSensor(task_id="a", job="orders").deferrable
