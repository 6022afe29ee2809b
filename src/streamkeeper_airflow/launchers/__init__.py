"""Where a job's driver runs: detached from the Airflow task that starts it.

    launcher_for("embedded")                        # `streamkeeper run ... --detach`
    launcher_for("spark_submit", spark_submit=...)  # client mode (or cluster: k8s, YARN)
    launcher_for("ssh", ssh_conn_id=...)            # detached on a Spark gateway host
    launcher_for("kubernetes", namespace=..., image=...)  # a SparkApplication

Whichever launched it, a driver is followed through the control plane only (its run
token's beat and heartbeat: streamkeeper/lineage/driver_beat.py). README "Deploying".
"""

from __future__ import annotations

from typing import Any

from streamkeeper_airflow.launchers.base import LaunchedDriver, Launcher, LaunchRequest

__all__ = ["LAUNCHERS", "LaunchRequest", "LaunchedDriver", "Launcher", "launcher_for"]

LAUNCHERS = ("embedded", "spark_submit", "ssh", "kubernetes")


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
    if name == "ssh":  # on a Spark gateway host over Airflow's SSH connection
        from streamkeeper_airflow.launchers.ssh import SshGatewayLauncher

        return SshGatewayLauncher(**options)
    if name == "kubernetes":  # a SparkApplication of the Spark Kubernetes Operator
        from streamkeeper_airflow.launchers.kubernetes import KubernetesLauncher

        return KubernetesLauncher(**options)
    raise ValueError(f"unknown launcher {name!r}; expected one of {', '.join(LAUNCHERS)}")
