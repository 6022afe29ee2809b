"""Deployment settings of the Airflow layer: Airflow config section `[streamkeeper]`.

    [streamkeeper]
    jobs_folder = /opt/jobs        # job specs (*/job.yaml) the DAGs are generated from
    workdir = /var/lib/streamkeeper  # drivers' working directory (relative spec paths)
    alert_notifiers = [{"class": "airflow.providers.smtp.notifications.smtp.SmtpNotifier",
        "kwargs": {"to": "oncall@example.com"}}]      # Airflow notifiers alerts go to
    alert_sink = https://hooks.example/alerts       # or a file (one machine only)
    trigger_overrides = source.path, sinks.*.mode   # override keys a trigger may set too
    spark_masters = spark://gateway:7077            # masters a trigger may pick too
    driver_env = NATS_CREDS, MYCOMPANY_*            # worker variables the driver gets too
    spec_folders = /opt/releases                    # more folders specs may be taken from
    ui_conn_id = streamkeeper_default               # the operations page's connection
    airflow_api_url = https://airflow.internal      # Airflow's API as the page reaches it

Each is also an environment variable (AIRFLOW__STREAMKEEPER__WORKDIR, ...), as any
Airflow option is; all are declared in the provider's config (provider.py), and
`alert_sink` and `alert_notifiers` are sensitive, so `..._cmd` and `..._secret` work too.
`alert_notifiers` names notifier classes by import path (code to run): as every option
here, only the deployment sets it (notifications/alerts.py has its form).
"""

from __future__ import annotations

import os
from pathlib import Path

SECTION = "streamkeeper"


def option(key: str, fallback: str | None = None) -> str | None:
    """`[streamkeeper] key` from Airflow's configuration, else `fallback`."""
    try:
        from airflow.sdk import conf

        value = conf.get(SECTION, key, fallback=None)
    except Exception:  # noqa: BLE001 - outside Airflow, or the section is not declared
        value = os.environ.get(f"AIRFLOW__{SECTION.upper()}__{key.upper()}")
    return value or fallback


def jobs_folder(default: Path) -> Path:
    return Path(option("jobs_folder") or default)


def workdir() -> str:
    """Where drivers run: `[streamkeeper] workdir`, else this process's directory."""
    return str(Path(option("workdir") or os.getcwd()).resolve())


def first_beat_grace() -> float:
    """How long a launched driver may take to beat first (lineage/driver_beat.py) before
    a start or a trigger concludes it never started: `[streamkeeper] first_beat_grace`
    seconds (180 covers spark-submit through SSH; raise it for pods that pull images)."""
    value = option("first_beat_grace") or "180"
    try:
        grace = float(value)
    except ValueError:
        raise ValueError(
            f"[streamkeeper] first_beat_grace = {value!r} is not a number of seconds; set e.g. 180"
        ) from None
    if grace <= 0:
        raise ValueError(f"[streamkeeper] first_beat_grace = {value!r} must be above 0; e.g. 180")
    return grace


def alert_sink() -> str | None:
    return option("alert_sink")


def alert_notifiers() -> str | None:
    """Airflow notifiers alerts go to, as JSON (parsed by notifications/alerts.py)."""
    return option("alert_notifiers")


def option_list(key: str) -> tuple[str, ...]:
    """`[streamkeeper] key` as a comma-separated list (empty when unset)."""
    return tuple(item.strip() for item in (option(key) or "").split(",") if item.strip())


def trigger_overrides() -> tuple[str, ...]:
    """Override keys (patterns) a trigger may set beyond the defaults (launch_policy.py)."""
    return option_list("trigger_overrides")


def spark_masters() -> tuple[str, ...]:
    """Spark masters a trigger may pick beyond the spec's own and local ones."""
    return option_list("spark_masters")


def driver_env() -> tuple[str, ...]:
    """Worker variables (names, or patterns such as `NATS_*`) the driver also gets."""
    return option_list("driver_env")


def spec_folders() -> tuple[str, ...]:
    """Folders besides the jobs folder that spec and suite paths may point into."""
    return option_list("spec_folders")
