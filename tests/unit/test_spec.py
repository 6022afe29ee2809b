"""The job spec: loading, durations, and error messages that name the field and the fix."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamkeeper.errors import SpecError
from streamkeeper.spec import load_spec, parse_duration, parse_spec

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "jobs" / "keyed_totals" / "job.yaml"


@pytest.fixture
def sample() -> dict[str, Any]:
    return yaml.safe_load(SAMPLE.read_text())


def spec_error(data: Any) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(data, source="'job.yaml'")
    return str(caught.value)


def test_sample_spec_loads() -> None:
    spec = load_spec(SAMPLE)
    assert spec.name == "keyed-totals"
    assert spec.lineage_id == "keyed-totals"
    assert spec.transform == "transform.py:build"
    assert [(s.name, s.output, s.key) for s in spec.sinks] == [
        ("totals", "merge", ["key"]),
        ("changes", "append", ["key"]),  # a changelog, compared by key in upgrades
    ]
    assert spec.source.schema_ddl == "event_id BIGINT, key STRING, value BIGINT"
    assert spec.source.options == {"maxFilesPerTrigger": "1"}
    assert spec.checkpoint.interval == 1.0
    assert spec.checkpoint.timeout == 600.0
    assert spec.state_backend.type == "hdfs"


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ("500ms", 0.5),
        ("2s", 2.0),
        ("1.5m", 90.0),
        ("1h", 3600.0),
        ("7", 7.0),
        (3, 3.0),
        (0.25, 0.25),
        (" 10 s ", 10.0),
        ("30d", 30 * 86400.0),
    ],
)
def test_durations_parse(given: Any, seconds: float) -> None:
    assert parse_duration(given) == pytest.approx(seconds)


@pytest.mark.parametrize("given", ["fast", "10 days", "1w", "", "-1s", True, -5])
def test_bad_durations_are_rejected_naming_the_value(given: Any) -> None:
    with pytest.raises(ValueError, match="invalid duration") as caught:
        parse_duration(given)
    assert repr(given) in str(caught.value)


def test_bad_duration_in_spec_names_field_and_value(sample: dict[str, Any]) -> None:
    sample["checkpoint"]["interval"] = "soon"
    message = spec_error(sample)
    assert "checkpoint.interval" in message
    assert "'soon'" in message
    assert "'10s'" in message  # the expected form


@pytest.mark.parametrize(
    ("field", "least"),
    [("markers_kept", "200"), ("history_checkpoints", "1000")],  # what the readers need
)
def test_too_little_kept_names_the_value_and_the_least(
    sample: dict[str, Any], field: str, least: str
) -> None:
    sample["maintenance"] = {field: 50}
    message = spec_error(sample)
    assert f"maintenance.{field}" in message and "50" in message and least in message


def test_unknown_field_is_a_typo(sample: dict[str, Any]) -> None:
    sample["checkpoint"]["intervall"] = "1s"
    message = spec_error(sample)
    assert "'job.yaml'" in message
    assert "checkpoint.intervall" in message
    assert "unknown field" in message and "spelling" in message


def test_missing_required_field(sample: dict[str, Any]) -> None:
    del sample["transform"]
    message = spec_error(sample)
    assert "transform: required field is missing" in message


def test_bad_name_pattern(sample: dict[str, Any]) -> None:
    sample["name"] = "Keyed_Totals"
    message = spec_error(sample)
    assert "name:" in message and "'Keyed_Totals'" in message
    assert "a-z, 0-9 and '-'" in message and "e.g. 'keyed-totals'" in message  # the form


def test_unknown_sink_mode(sample: dict[str, Any]) -> None:
    sample["sinks"][1]["mode"] = "twice"
    message = spec_error(sample)
    assert "sinks.1.mode" in message and "'twice'" in message
    assert "exactly_once" in message and "idempotent" in message and "at_least_once" in message


def test_merge_sink_needs_key(sample: dict[str, Any]) -> None:
    del sample["sinks"][0]["key"]
    message = spec_error(sample)
    assert "sinks.0" in message and "'totals'" in message
    assert "no key" in message and "key: [" in message


def test_key_must_be_in_columns(sample: dict[str, Any]) -> None:
    sample["sinks"][0]["columns"] = ["total"]
    assert "key columns ['key'] are not in columns" in spec_error(sample)


def test_merge_order_by_loads(sample: dict[str, Any]) -> None:
    sample["sinks"][0]["order_by"] = "events"
    spec = parse_spec(sample)
    assert spec.sinks[0].order_by == "events" and spec.sinks[1].order_by is None


@pytest.mark.parametrize(
    ("sink", "expected"),
    [
        (1, "order_by 'events' only applies to output 'merge'"),  # the append sink
        (0, "order_by 'key' is a key column"),
    ],
)
def test_order_by_is_for_merge_sinks_and_not_a_key(
    sample: dict[str, Any], sink: int, expected: str
) -> None:
    sample["sinks"][sink]["order_by"] = "key" if sink == 0 else "events"
    message = spec_error(sample)
    assert f"sinks.{sink}" in message and expected in message


def test_order_by_must_be_in_columns(sample: dict[str, Any]) -> None:
    sample["sinks"][0].update(columns=["key", "total"], order_by="events")
    message = spec_error(sample)
    assert "order_by 'events' is not in columns ['key', 'total']" in message
    assert "add it to columns" in message


def test_order_by_must_be_an_output_column(sample: dict[str, Any]) -> None:
    from streamkeeper.commit.batch import check_sink_columns

    sample["sinks"][0]["order_by"] = "updated_at"
    spec = parse_spec(sample)
    with pytest.raises(SpecError, match=r"sink 'totals' names columns \['updated_at'\]"):
        check_sink_columns(spec, ["key", "events", "total"])
    check_sink_columns(spec, ["key", "events", "total", "updated_at"])


def test_duplicate_sink_names(sample: dict[str, Any]) -> None:
    sample["sinks"][1]["name"] = "totals"
    sample["sinks"][1]["output"] = "merge"
    sample["sinks"][1]["key"] = ["key"]
    message = spec_error(sample)
    assert "sink names must be unique" in message and "['totals']" in message


def test_changelog_needs_rocksdb(sample: dict[str, Any]) -> None:
    sample["state_backend"] = {"type": "hdfs", "changelog": True}
    message = spec_error(sample)
    assert "state_backend" in message and "set type: rocksdb" in message
    sample["state_backend"]["type"] = "rocksdb"
    assert parse_spec(sample).state_backend.changelog is True


def test_negative_tolerable_failures(sample: dict[str, Any]) -> None:
    sample["checkpoint"]["tolerable_failures"] = -1
    message = spec_error(sample)
    assert "checkpoint.tolerable_failures" in message
    assert "greater than or equal to 0" in message and "(got -1)" in message


def test_file_source_needs_path(sample: dict[str, Any]) -> None:
    del sample["source"]["path"]
    assert "source.path is required" in spec_error(sample)


@pytest.mark.parametrize("top", [["a", "b"], "just text", None, 42])
def test_top_level_must_be_a_mapping(top: Any) -> None:
    message = spec_error(top)
    assert "expected a mapping at the top level" in message and repr(top) in message


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: x\nsinks: [unclosed\n")
    with pytest.raises(SpecError, match="is not valid YAML") as caught:
        load_spec(path)
    assert str(path) in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(SpecError, match="not found") as caught:
        load_spec(path)
    assert str(path) in str(caught.value)


def test_bad_transform_reference(sample: dict[str, Any]) -> None:
    sample["transform"] = "transform.py"  # no ':function'
    message = spec_error(sample)
    assert "transform:" in message and "'transform.py'" in message


@pytest.mark.parametrize("ref", ["transform.py:nope", "missing.py:build", "no_such_mod:build"])
def test_unloadable_transform_names_the_reference(ref: str) -> None:
    from streamkeeper.runtime.job import load_transform

    spec = load_spec(SAMPLE, {"transform": ref})
    with pytest.raises(SpecError, match="cannot be loaded") as caught:
        load_transform(spec, SAMPLE.parent)
    assert repr(ref) in str(caught.value)
    assert "file.py:function" in str(caught.value)


def test_dotted_overrides_apply() -> None:
    spec = load_spec(
        SAMPLE,
        {
            "storage.root": "s3://bucket/prefix",
            "source.path": "/data/events",
            "checkpoint.interval": "250ms",
            "spark.shuffle_partitions": "8",
            "lineage": "keyed-v2",
        },
    )
    assert spec.storage.root == "s3://bucket/prefix"
    assert spec.source.path == "/data/events"
    assert spec.checkpoint.interval == 0.25
    assert spec.spark.shuffle_partitions == 8
    assert spec.lineage_id == "keyed-v2"


def test_override_is_validated_too() -> None:
    with pytest.raises(SpecError, match="checkpoint.mode"):
        load_spec(SAMPLE, {"checkpoint.mode": "sometimes"})


def test_override_through_a_scalar_is_refused() -> None:
    with pytest.raises(SpecError, match="override 'name.first'"):
        load_spec(SAMPLE, {"name.first": "x"})


def test_override_of_a_list_item() -> None:
    spec = load_spec(SAMPLE, {"sinks.1.mode": "idempotent"})
    assert spec.sinks[1].mode == "idempotent"
    with pytest.raises(SpecError, match="override 'sinks.5.mode'"):
        load_spec(SAMPLE, {"sinks.5.mode": "idempotent"})


def test_sink_mode_inherits_checkpoint_mode(sample: dict[str, Any]) -> None:
    spec = parse_spec(sample)
    assert [spec.sink_mode(s) for s in spec.sinks] == ["exactly_once", "exactly_once"]
    relaxed = copy.deepcopy(sample)
    relaxed["checkpoint"]["mode"] = "at_least_once"
    relaxed["sinks"][0]["mode"] = "idempotent"
    spec = parse_spec(relaxed)
    assert [spec.sink_mode(s) for s in spec.sinks] == ["idempotent", "at_least_once"]
