"""`streamkeeper driver-archive` and `spark.class_data_archive`: a driver started from a
spec naming the archive loads Spark's classes from it, not from the jars.

CI's setup makes the tests' archive with the same command (infra/driver_jvm.sh), so the
command's own run is paid once; without that archive this test makes one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamkeeper.runtime.class_data import create_archive

REPO = Path(__file__).resolve().parents[2]
SAMPLE_SPEC = REPO / "jobs" / "keyed_totals" / "job.yaml"

SCRIPT = r"""
import sys
from streamkeeper.runtime.session import build_session
from streamkeeper.spec import load_spec

spec = load_spec(sys.argv[1], {
    "spark.class_data_archive": sys.argv[2],
    "spark.conf": {"spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={sys.argv[3]}"},
})
build_session(spec, "local[1]").stop()
"""


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = os.environ.get("DRIVER_JVM_ARCHIVE", "")
    if made and Path(made).is_file():
        return Path(made)
    return_path = tmp_path_factory.mktemp("archive") / "drivers.jsa"
    assert create_archive(return_path) > 0
    return return_path


def test_a_driver_named_the_archive_maps_sparks_classes_from_it(
    archive: Path, tmp_path: Path
) -> None:
    loaded = tmp_path / "class-load.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
        "PYSPARK_SUBMIT_ARGS": "pyspark-shell",  # not the tests' own JVM options
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(SAMPLE_SPEC), str(archive), str(loaded)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    sources = {
        line.split("] ", 1)[1].split(" source: ")[0]: line.split(" source: ")[1]
        for line in loaded.read_text().splitlines()
        if " source: " in line
    }
    # The spec's own JVM option took effect too (this log), and the archive with it.
    assert sources["org.apache.spark.SparkContext"] == "shared objects file (top)"
    from_archive = sum(1 for s in sources.values() if s == "shared objects file (top)")
    assert from_archive > 1000, f"only {from_archive} classes from the archive"
