"""Job specs for tests: a spec file with its data paths pointed into a test's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamkeeper.spec import JobSpec, load_spec
from tests.conftest import SAMPLE_SPEC


def local_spec(tmp_path: Path, spec_path: Path = SAMPLE_SPEC, **overrides: Any) -> JobSpec:
    """`spec_path` reading `tmp_path/events`, writing below `tmp_path`, on local[2] Spark."""
    return load_spec(
        spec_path,
        {
            "source.path": str(tmp_path / "events"),
            "storage.root": str(tmp_path / "data"),
            "checkpoint.dir": str(tmp_path / "checkpoint"),
            "spark.master": "local[2]",
            "spark.shuffle_partitions": 2,
            **overrides,
        },
    )
