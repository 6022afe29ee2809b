"""The driver's session start: PySpark's converter import is paid while the JVM launches,
and the checkpoint file manager Spark will use for the job's checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamkeeper.runtime.session import CONVERTER_IMPORT, import_in_background
from tests.support.driver import SAMPLE_SPEC, driver_env

pytestmark = pytest.mark.integration

# In a fresh interpreter: which thread loads the converter's module (a meta path finder
# is asked by the thread that loads it), and whether the session then works.
PROBE = """
import json, sys, threading
loaded_by = []

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == sys.argv[2]:
            loaded_by.append(threading.current_thread().name)
        return None

sys.meta_path.insert(0, Watch())
from streamkeeper.runtime.session import build_session
from streamkeeper.spec import load_spec

spark = build_session(load_spec(sys.argv[1], json.loads(sys.argv[3])), "local[1]")
rows = spark.createDataFrame([(1, "a"), (2, "b")], "n int, s string").collect()
# What Spark's streaming query would use for a checkpoint here (its session's Hadoop conf).
jvm = spark._jvm
manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
used = manager.create(
    jvm.org.apache.hadoop.fs.Path(sys.argv[4]), spark._jsparkSession.sessionState().newHadoopConf()
)
print(json.dumps({
    "loaded_by": loaded_by,
    "rows": [list(r) for r in rows],
    "manager": used.getClass().getName(),
}))
"""
CHECKPOINTING = "org.apache.spark.sql.execution.streaming.checkpointing."


def _probe(tmp_path: Path, settings: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(SAMPLE_SPEC), CONVERTER_IMPORT,
         json.dumps(settings), str(tmp_path / "checkpoint")],
        capture_output=True, text=True, env=driver_env(), cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_converter_module_is_loaded_beside_the_gateway_launch(tmp_path: Path) -> None:
    seen = _probe(tmp_path, {})
    # Loaded once, by the background import, not by the main thread after the launch.
    assert seen["loaded_by"] == [f"streamkeeper-import-{CONVERTER_IMPORT}"], seen
    assert seen["rows"] == [[1, "a"], [2, "b"]]
    # Not Spark's default (FileContext-based: Hadoop forks chmod and readlink per file).
    assert seen["manager"] == CHECKPOINTING + "FileSystemBasedCheckpointFileManager"


def test_a_specs_checkpoint_file_manager_is_the_one_spark_uses(tmp_path: Path) -> None:
    chosen = CHECKPOINTING + "FileContextBasedCheckpointFileManager"
    key = "spark.conf.spark.sql.streaming.checkpointFileManagerClass"
    assert _probe(tmp_path, {key: chosen})["manager"] == chosen


def test_a_loaded_module_is_not_imported_again() -> None:
    assert import_in_background("json") is None


def test_a_failed_background_import_raises_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="streamkeeper.runtime.session")
    thread = import_in_background("streamkeeper_no_such_module")
    assert thread is not None
    thread.join(10)
    assert "could not import streamkeeper_no_such_module" in caplog.text
    assert "streamkeeper_no_such_module" not in sys.modules
