"""The sensors' modes: deferrable by default, poke on request, never reschedule."""

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
    deferred = CheckpointProgressSensor(task_id="a", job="orders")
    poking = CheckpointProgressSensor(task_id="b", job="orders", deferrable=False, mode="poke")
    assert deferred.deferrable and not poking.deferrable and poking.mode == "poke"
