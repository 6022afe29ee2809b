"""The quality gate of an upgrade: a job's Great Expectations suite over its tables.

The suite is kept beside the job's spec (`jobs/{job}/expectations.yaml`), one list of
Great Expectations 1.x expectations per sink:

    sinks:
      totals:
        - {type: expect_column_values_to_not_be_null, kwargs: {column: key}}
        - {type: expect_column_values_to_be_between, kwargs: {column: total, min_value: 0}}
      means:
        - {type: expect_column_values_to_be_between, kwargs: {column: mean, min_value: 0},
           when_column_present: true}

An expectation marked `when_column_present` is skipped when its column is absent (a
column only one version writes); any other expectation on a missing column fails. A
sink the suite names that the validated version does not write is skipped too (blue
and green may have different sinks). Great Expectations is imported on first use only
(it takes seconds): the Airflow layer's DAG files never import it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from streamkeeper.errors import SpecError

if TYPE_CHECKING:
    import pandas as pd


class QualityGateError(SpecError):
    """An expectation suite file that cannot be used (names the file, the value, the fix)."""


@dataclass(frozen=True)
class Expectation:
    type: str
    kwargs: dict[str, Any]
    when_column_present: bool = False

    @property
    def column(self) -> str | None:
        return self.kwargs.get("column")


@dataclass(frozen=True)
class ExpectationSuiteFile:
    path: Path
    suites: dict[str, list[Expectation]]  # sink -> its expectations


@dataclass
class SinkVerdict:
    sink: str
    success: bool
    evaluated: int
    rows: int
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass
class QualityReport:
    success: bool
    sinks: list[SinkVerdict]

    def to_json(self) -> dict[str, Any]:
        return {"success": self.success, "sinks": [asdict(s) for s in self.sinks]}

    def summary(self) -> str:
        failed = [f"{s.sink}: {'; '.join(s.failed)}" for s in self.sinks if not s.success]
        if failed:
            return "failed expectations - " + " | ".join(failed)
        checked = sum(s.evaluated for s in self.sinks)
        return f"{checked} expectations met on {len(self.sinks)} table(s)"


def load_expectations(path: str | Path) -> ExpectationSuiteFile:
    """Read and check a suite file (every expectation type must be one GX knows).

    Raises:
        QualityGateError: missing, not YAML, or malformed (the field and the fix).
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise QualityGateError(
            f"expectation suite {str(path)!r} not found; keep one beside the job's spec "
            "(expectations.yaml) or pass its path"
        ) from None
    except yaml.YAMLError as error:
        raise QualityGateError(
            f"expectation suite {str(path)!r} is not valid YAML: {error}"
        ) from None
    sinks = data.get("sinks") if isinstance(data, dict) else None
    if not isinstance(sinks, dict) or not sinks:
        raise QualityGateError(
            f"expectation suite {str(path)!r}: expected a mapping `sinks: {{sink: [expectation, "
            f"...]}}` at the top level, got {data!r}"
        )
    known = _known_types()
    suites: dict[str, list[Expectation]] = {}
    for sink, items in sinks.items():
        if not isinstance(items, list):
            raise QualityGateError(
                f"expectation suite {str(path)!r}: sinks.{sink} must be a list of expectations, "
                f"got {items!r}"
            )
        suites[str(sink)] = [
            _expectation(path, sink, n, item, known) for n, item in enumerate(items)
        ]
    return ExpectationSuiteFile(path, suites)


def _expectation(path: Path, sink: str, index: int, item: Any, known: set[str]) -> Expectation:
    where = f"expectation suite {str(path)!r}: sinks.{sink}.{index}"
    if not isinstance(item, dict) or set(item) - {"type", "kwargs", "when_column_present"}:
        raise QualityGateError(
            f"{where}: expected {{type, kwargs, when_column_present}}, got {item!r}"
        )
    kind, kwargs = item.get("type"), item.get("kwargs", {})
    if kind not in known:
        raise QualityGateError(
            f"{where}: unknown expectation type {kind!r}; use one of Great Expectations' "
            "(e.g. expect_column_values_to_not_be_null, expect_column_values_to_be_between)"
        )
    if not isinstance(kwargs, dict):
        raise QualityGateError(f"{where}: kwargs must be a mapping, got {kwargs!r}")
    return Expectation(kind, dict(kwargs), bool(item.get("when_column_present", False)))


def _known_types() -> set[str]:
    from great_expectations.expectations.registry import list_registered_expectation_implementations

    _quiet()
    return set(list_registered_expectation_implementations())


def _quiet() -> None:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


def validate_rows(frames: Mapping[str, pd.DataFrame], suite: ExpectationSuiteFile) -> QualityReport:
    """Validate each sink's rows with its expectations (sinks the suite lacks pass)."""
    import great_expectations as gx
    from great_expectations.expectations.expectation_configuration import (
        ExpectationConfiguration,
    )

    _quiet()
    context = gx.get_context(mode="ephemeral")
    _no_progress_bars(context)
    source = context.data_sources.add_pandas("streamkeeper")
    verdicts = []
    for sink, frame in frames.items():
        expectations = suite.suites.get(sink)
        if expectations is None:
            continue
        applied = [e for e in expectations if not _skip(e, frame)]
        skipped = [f"{e.type}({e.column})" for e in expectations if _skip(e, frame)]
        if not applied:
            verdicts.append(SinkVerdict(sink, True, 0, len(frame), skipped=skipped))
            continue
        asset = source.add_dataframe_asset(name=sink)
        batch = asset.add_batch_definition_whole_dataframe(f"{sink}-whole").get_batch(
            batch_parameters={"dataframe": frame}
        )
        gx_suite = gx.ExpectationSuite(name=sink)
        for expectation in applied:
            config = ExpectationConfiguration(type=expectation.type, kwargs=expectation.kwargs)
            gx_suite.add_expectation(config.to_domain_obj())
        result = batch.validate(gx_suite)
        failed = [_describe(r) for r in result.results if not r.success]
        verdicts.append(
            SinkVerdict(sink, bool(result.success), len(applied), len(frame), failed, skipped)
        )
    return QualityReport(all(v.success for v in verdicts), verdicts)


def validate_tables(
    tables: Mapping[str, tuple[str, int | None]],
    suite: ExpectationSuiteFile,
    location_options: Callable[[str], dict[str, str]] | None = None,
) -> QualityReport:
    """Validate Delta tables (sink -> (URI, version or None for the latest))."""
    from deltalake import DeltaTable

    from streamkeeper.storage import Location

    frames = {}
    for sink, (uri, version) in tables.items():
        if sink not in suite.suites:
            continue
        options = location_options(uri) if location_options else Location(uri).storage_options()
        table = DeltaTable(uri, version=version, storage_options=options)
        frames[sink] = table.to_pyarrow_dataset().to_table(use_threads=False).to_pandas()
    return validate_rows(frames, suite)


def _skip(expectation: Expectation, frame: pd.DataFrame) -> bool:
    return (
        expectation.when_column_present
        and expectation.column is not None
        and expectation.column not in frame.columns
    )


def _describe(result: Any) -> str:
    config = result.expectation_config
    details = result.result or {}
    column = config.kwargs.get("column")
    if result.exception_info and result.exception_info.get("raised_exception"):
        message = str(result.exception_info.get("exception_message", "")).splitlines()[0]
        return f"{config.type}({column}): {message}"
    seen = {k: details[k] for k in ("unexpected_count", "observed_value") if k in details}
    sample = details.get("partial_unexpected_list")
    if sample:
        seen["e.g."] = sample[:3]
    return f"{config.type}({column}): {seen}"


def _no_progress_bars(context: Any) -> None:
    try:
        from great_expectations.data_context.types.base import ProgressBarsConfig

        context.variables.progress_bars = ProgressBarsConfig(globally=False)
    except Exception:  # noqa: BLE001 - cosmetic: bars on stderr if this API moved
        pass
