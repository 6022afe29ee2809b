"""The upgrade's quality gate: a job's Great Expectations suite (real GX 1.x) over real
Delta tables: good rows pass, a broken version's rows fail with the expectation and the
column named, optional columns are skipped only when absent, and bad suite files are
refused with the file, the value and the fix."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from deltalake import write_deltalake

from streamkeeper.upgrade.quality import (
    QualityGateError,
    load_expectations,
    validate_rows,
    validate_tables,
)

REPO = Path(__file__).resolve().parents[2]
SAMPLE_SUITE = REPO / "jobs" / "keyed_totals" / "expectations.yaml"


def _totals(totals: list[int], mean: bool = False) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "key": [f"k{i:04d}" for i in range(len(totals))],
            "events": [2] * len(totals),
            "total": totals,
        }
    )
    if mean:
        frame["mean"] = frame["total"] / frame["events"]
    return frame


def test_the_sample_suite_passes_good_rows_and_names_what_a_broken_version_got_wrong() -> None:
    suite = load_expectations(SAMPLE_SUITE)
    good = validate_rows({"totals": _totals([10, 20]), "means": _totals([4], mean=True)}, suite)
    assert good.success, good.summary()
    assert [s.sink for s in good.sinks] == ["totals", "means"]
    assert good.sinks[0].evaluated == len(suite.suites["totals"]) and good.sinks[0].rows == 2

    bad = validate_rows({"totals": _totals([10, -20])}, suite)
    assert not bad.success
    (failure,) = bad.sinks[0].failed
    assert "expect_column_values_to_be_between(total)" in failure and "-20" in failure
    assert "total" in bad.summary() and bad.to_json()["success"] is False


def test_an_optional_column_is_checked_when_present_and_skipped_when_absent(
    tmp_path: Path,
) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(
        "sinks:\n  totals:\n"
        "    - {type: expect_column_values_to_be_between, kwargs: {column: mean, max_value: 5},"
        " when_column_present: true}\n"
        "    - {type: expect_column_values_to_not_be_null, kwargs: {column: gone}}\n"
    )
    suite = load_expectations(path)
    absent = validate_rows({"totals": _totals([10])}, suite)
    assert absent.sinks[0].skipped == ["expect_column_values_to_be_between(mean)"]
    assert not absent.success and "gone" in absent.sinks[0].failed[0], "a required column"
    present = validate_rows({"totals": _totals([100], mean=True)}, suite)
    assert any("mean" in f for f in present.sinks[0].failed), "the optional check did not run"


def test_tables_are_read_at_the_version_asked_for(tmp_path: Path) -> None:
    table = str(tmp_path / "totals")
    write_deltalake(table, _totals([1, 2]))
    write_deltalake(table, _totals([1, -2]), mode="overwrite")
    suite = load_expectations(SAMPLE_SUITE)
    assert validate_tables({"totals": (table, 0)}, suite).success
    latest = validate_tables({"totals": (table, None), "elsewhere": (table, None)}, suite)
    assert not latest.success and [s.sink for s in latest.sinks] == ["totals"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("sinks:\n  totals:\n    - {type: expect_the_moon, kwargs: {}}\n", "expect_the_moon"),
        ("sinks: [totals]\n", "sinks"),
        ("sinks:\n  totals: {type: x}\n", "sinks.totals"),
        ("sinks:\n  totals:\n    - {type: expect_column_values_to_not_be_null, kw: 1}\n", "kw"),
        ("sinks: {totals: [\n", "not valid YAML"),
    ],
)
def test_a_bad_suite_file_is_refused_naming_the_value_and_the_fix(
    tmp_path: Path, text: str, named: str
) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    with pytest.raises(QualityGateError) as raised:
        load_expectations(path)
    assert named in str(raised.value) and str(path) in str(raised.value)


def test_a_missing_suite_file_says_where_to_put_one(tmp_path: Path) -> None:
    with pytest.raises(QualityGateError, match="expectations.yaml"):
        load_expectations(tmp_path / "nowhere.yaml")
