"""Python workers started while the driver starts: a later task gets a worker that has the
batch writer imported already. In a fresh JVM of its own (a subprocess), so no earlier
test's workers are in the pool."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn

import pytest

from streamkeeper.runtime.python_workers import REUSE_KEY, warm_python_workers

REPO = Path(__file__).resolve().parents[2]
SAMPLE_SPEC = REPO / "jobs" / "keyed_totals" / "job.yaml"

SCRIPT = r"""
import json, sys
from streamkeeper.runtime.python_workers import warm_python_workers
from streamkeeper.runtime.session import build_session
from streamkeeper.spec import load_spec


def probe(batches):
    import os, sys
    import pyarrow as pa

    rows = [
        {"pid": os.getpid(), "writer": "streamkeeper.commit.writer" in sys.modules}
        for _ in batches
    ]
    yield pa.RecordBatch.from_pylist(
        rows, schema=pa.schema([("pid", pa.int64()), ("writer", pa.bool_())])
    )


spark = build_session(load_spec(sys.argv[1]), "local[1]")  # one core: one worker


def run_probe():
    rows = spark.range(0, 1, numPartitions=1).mapInArrow(probe, "pid long, writer boolean")
    return [row.asDict() for row in rows.collect()]


before = run_probe()
thread = warm_python_workers(spark)
thread.join(120)
after = run_probe()
print("RESULT " + json.dumps({"before": before, "after": after, "running": thread.is_alive()}))
spark.stop()
"""


def test_a_task_after_the_warm_up_finds_the_writer_imported_in_its_worker() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(SAMPLE_SPEC)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    seen = json.loads(line.removeprefix("RESULT "))
    assert not seen["running"]
    (before,) = seen["before"]
    (after,) = seen["after"]
    assert before["writer"] is False  # a cold worker has not imported it
    assert after == {"pid": before["pid"], "writer": True}  # the same worker, now warm


def test_no_warm_up_where_spark_would_not_keep_the_workers() -> None:
    conf = {REUSE_KEY: "False"}
    context = SimpleNamespace(getConf=lambda: SimpleNamespace(get=lambda k, d: conf.get(k, d)))
    assert warm_python_workers(SimpleNamespace(sparkContext=context)) is None  # type: ignore[arg-type]


def test_a_warm_up_that_fails_is_logged_and_raises_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only the timing depends on the warm-up: a failure there must not reach the driver's
    start (the first batch then starts its own workers)."""

    def broken_range(*_args: object, **_kwargs: object) -> NoReturn:
        raise RuntimeError("the JVM went away")

    context = SimpleNamespace(
        getConf=lambda: SimpleNamespace(get=lambda _k, default: default),
        setLocalProperty=lambda _k, _v: None,
        defaultParallelism=2,
    )
    spark = SimpleNamespace(sparkContext=context, range=broken_range)
    with caplog.at_level(logging.DEBUG, logger="streamkeeper.runtime.python_workers"):
        thread = warm_python_workers(spark)  # type: ignore[arg-type]
        assert thread is not None
        thread.join(10)
    assert not thread.is_alive()
    (record,) = [r for r in caplog.records if "could not start Python workers" in r.message]
    assert record.exc_info is not None and "the JVM went away" in str(record.exc_info[1])
