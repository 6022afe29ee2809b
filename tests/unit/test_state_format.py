"""The canonical savepoint manifest and operator uids (no Spark needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamkeeper.errors import SpecError
from streamkeeper.spec import parse_spec
from streamkeeper.state.errors import CanonicalManifestError, OperatorUidError
from streamkeeper.state.format import (
    CanonicalManifest,
    OperatorState,
    read_canonical_manifest,
    write_canonical_manifest,
)
from streamkeeper.state.spark_state import OperatorInfo
from streamkeeper.state.uids import resolve_uids
from streamkeeper.storage import Location

OPERATOR = OperatorState(
    uid="totals",
    operator_id=0,
    operator_name="stateStoreSave",
    store_names=["default"],
    partitions=4,
    key_schema='{"type":"struct","fields":[]}',
    value_schema='{"type":"struct","fields":[]}',
    table="state/totals",
    rows=3,
    bytes=100,
)


def manifest(**changes: object) -> CanonicalManifest:
    values = {
        "id": "sp-1",
        "job": "keyed-totals",
        "lineage": "keyed-totals",
        "batch_id": 2,
        "checkpoint_id": 7,
        "operators": [OPERATOR],
        "source": {"offsets": {"sources": []}, "log": {}},
        "sink_seqs": {"totals": 7},
        "spark_version": "4.2.0",
        "created_at": 1.0,
        **changes,
    }
    return CanonicalManifest(**values)  # type: ignore[arg-type]


def test_a_manifest_round_trips_and_keeps_fields_it_does_not_own(tmp_path: Path) -> None:
    folder = Location(str(tmp_path / "sp"))
    written = manifest(extra={"registry": {"pinned": True}})
    write_canonical_manifest(folder, written)
    data = json.loads((tmp_path / "sp" / "manifest.json").read_text())
    assert data["format"] == "canonical" and data["registry"] == {"pinned": True}
    assert data["operators"][0]["uid"] == "totals"
    assert read_canonical_manifest(folder) == written
    assert written.operator("totals") == OPERATOR


def test_bad_manifests_say_what_is_wrong(tmp_path: Path) -> None:
    folder = Location(str(tmp_path / "sp"))
    with pytest.raises(CanonicalManifestError, match="no savepoint at .*manifest.json is missing"):
        read_canonical_manifest(folder)
    (tmp_path / "sp").mkdir()
    (tmp_path / "sp" / "manifest.json").write_text("{not json")
    with pytest.raises(CanonicalManifestError, match="not valid JSON"):
        read_canonical_manifest(folder)
    data = manifest().to_dict()
    with pytest.raises(CanonicalManifestError, match="format 'native'.*native savepoint"):
        CanonicalManifest.from_dict({**data, "format": "native"})
    del data["batch_id"]
    with pytest.raises(CanonicalManifestError, match=r"lacks \['batch_id'\]"):
        CanonicalManifest.from_dict(data)
    with pytest.raises(CanonicalManifestError, match="no operator uid 'x'; its uids are"):
        manifest().operator("x")


OPERATORS = [
    OperatorInfo(0, "stateStoreSave", ("default",), 4),
    OperatorInfo(1, "dedupe", ("default",), 4),
]


def state_spec(operators: list) -> object:
    base = {"name": "x", "source": {"type": "rate"}, "transform": "a:b", "sinks": [{"name": "s"}]}
    return parse_spec({**base, "state": {"operators": operators}}).state


def test_uids_by_position_or_explicit_id() -> None:
    assert resolve_uids(None, OPERATORS) == {0: "op-0", 1: "op-1"}
    spec = state_spec([{"uid": "totals"}, {"uid": "dedup"}])
    assert resolve_uids(spec, OPERATORS) == {0: "totals", 1: "dedup"}
    spec = state_spec([{"uid": "dedup", "operator_id": 1}, {"uid": "totals", "operator_id": 0}])
    assert resolve_uids(spec, OPERATORS) == {0: "totals", 1: "dedup"}


def test_uids_that_do_not_fit_the_query_are_refused() -> None:
    with pytest.raises(
        OperatorUidError, match=r"operator\(s\) 1 \(dedupe\) have no uid.*operator_id: 1"
    ):
        resolve_uids(state_spec([{"uid": "totals"}]), OPERATORS)
    with pytest.raises(OperatorUidError, match=r"\['late'\] to operator id\(s\) \[2\]"):
        resolve_uids(state_spec([{"uid": "t"}, {"uid": "d"}, {"uid": "late"}]), OPERATORS)


@pytest.mark.parametrize(
    ("operators", "message"),
    [
        ([{"uid": "Totals"}], "uid 'Totals' must be 1 to 64 characters"),
        ([{"uid": "a"}, {"uid": "a"}], r"uid\(s\) \['a'\] appear more than once"),
        ([{"uid": "a"}, {"uid": "b", "operator_id": 0}], r"operator_id \[0\] is named by more"),
        ([{"uid": "a", "operator_id": -1}], "greater than or equal to 0"),
    ],
)
def test_the_state_section_is_validated_on_load(operators: list, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        state_spec(operators)
