"""Start real local services (SeaweedFS S3, Spark standalone, NATS) for tests,
demos and benchmarks.

Each service runs from a script in ``<repo>/infra`` (override with
``STREAMKEEPER_INFRA_DIR``) as its own process group, bound to ``127.0.0.1``
only, logging to a file. Stopping sends SIGTERM to that group, then SIGKILL
after a grace period. Binaries (``weed``, ``nats-server``, ``spark-class``) are
looked up next to the running interpreter first, then on ``PATH``.

Example:
    >>> s3 = start_seaweedfs(tmp / "s3", "lake", "key", "secret")  # doctest: +SKIP
    >>> try:
    ...     write_deltalake(f"s3://{s3.bucket}/t", df, storage_options=s3.env())
    ... finally:
    ...     s3.stop()
"""

from __future__ import annotations

from infra.components.process import (
    HOST,
    INFRA_DIR_ENV,
    LocalService,
    ServiceError,
    free_port,
    infra_dir,
)
from tests.support.services.nats import NatsServer, start_nats
from tests.support.services.seaweedfs import SeaweedFS, start_seaweedfs
from tests.support.services.spark_standalone import SparkStandalone, start_spark_standalone

__all__ = [
    "HOST",
    "INFRA_DIR_ENV",
    "LocalService",
    "NatsServer",
    "SeaweedFS",
    "ServiceError",
    "SparkStandalone",
    "free_port",
    "infra_dir",
    "start_nats",
    "start_seaweedfs",
    "start_spark_standalone",
]
