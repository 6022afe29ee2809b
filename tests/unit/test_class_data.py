"""The driver's class-data archive setting: how it joins the driver's JVM options, and
the values it refuses."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from streamkeeper.errors import SpecError, StreamkeeperError
from streamkeeper.runtime.class_data import (
    JAVA_OPTIONS_KEY,
    MAP_OPTION,
    create_archive,
    driver_java_options,
)
from streamkeeper.spec import load_spec

SAMPLE = Path(__file__).resolve().parents[2] / "jobs" / "keyed_totals" / "job.yaml"


def test_no_archive_adds_nothing() -> None:
    assert driver_java_options(load_spec(SAMPLE)) == {}


def test_an_archive_joins_the_specs_own_options(tmp_path: Path) -> None:
    archive = tmp_path / "drivers.jsa"
    archive.write_bytes(b"x")
    spec = load_spec(
        SAMPLE,
        {
            "spark.class_data_archive": str(archive),
            "spark.conf": {JAVA_OPTIONS_KEY: "-Dmine=1 -Xss4m"},
        },
    )
    assert driver_java_options(spec) == {JAVA_OPTIONS_KEY: f"-Dmine=1 -Xss4m {MAP_OPTION}{archive}"}


def test_a_missing_archive_is_left_out_with_the_command_that_makes_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    archive = tmp_path / "not-made-yet.jsa"
    spec = load_spec(
        SAMPLE,
        {"spark.class_data_archive": str(archive), "spark.conf": {JAVA_OPTIONS_KEY: "-Dm=1"}},
    )
    with caplog.at_level(logging.WARNING):
        assert driver_java_options(spec) == {JAVA_OPTIONS_KEY: "-Dm=1"}
    assert f"streamkeeper driver-archive {archive}" in caplog.text


@pytest.mark.parametrize("value", ["drivers.jsa", "/opt/spark drivers/a.jsa"])
def test_a_relative_path_or_a_space_is_refused(value: str) -> None:
    with pytest.raises(SpecError, match="absolute path without spaces") as caught:
        load_spec(SAMPLE, {"spark.class_data_archive": value})
    assert repr(value) in str(caught.value)


def test_making_an_archive_at_a_path_with_a_space_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    target = tmp_path / "a dir" / "drivers.jsa"
    with pytest.raises(StreamkeeperError, match="has a space") as caught:
        create_archive(target)
    assert str(target) in str(caught.value)
    assert not (tmp_path / "a dir").exists()
