"""Where a job's driver runs: on the Airflow worker (embedded) or through spark-submit.

    launcher_for("embedded")                      # `streamkeeper run ... --detach`
    launcher_for("spark_submit", spark_submit=...)  # client mode on a standalone master

Kubernetes is documented in README.md (a pod named after the run token).
"""

from __future__ import annotations

from typing import Any

from streamkeeper_airflow.launchers.base import LaunchedDriver, Launcher, LaunchRequest

__all__ = ["LAUNCHERS", "LaunchRequest", "LaunchedDriver", "Launcher", "launcher_for"]

LAUNCHERS = ("embedded", "spark_submit")


def launcher_for(name: str, **options: Any) -> Launcher:
    """The launcher called `name`.

    Raises:
        ValueError: an unknown name (lists the known ones).
    """
    if name == "embedded":
        from streamkeeper_airflow.launchers.embedded import EmbeddedLauncher

        return EmbeddedLauncher(**options)
    if name == "spark_submit":
        from streamkeeper_airflow.launchers.spark_submit import SparkSubmitLauncher

        return SparkSubmitLauncher(**options)
    raise ValueError(f"unknown launcher {name!r}; expected one of {', '.join(LAUNCHERS)}")
