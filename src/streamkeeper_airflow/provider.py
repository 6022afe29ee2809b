"""`get_provider_info()`: how Airflow's ProvidersManager learns about this package.

Registered in provider/pyproject.toml as the `apache_airflow_provider` entry point of the
`airflow-provider-streamkeeper` distribution (the provider's `package-name` must be that
distribution's name).
"""

from __future__ import annotations

from typing import Any

from streamkeeper_airflow import __version__
from streamkeeper_airflow.connection_form import provider_connection_form

_MODULES = {
    "hooks": ["streamkeeper_airflow.hooks.streamkeeper"],
    "operators": [
        "streamkeeper_airflow.operators.start",
        "streamkeeper_airflow.operators.restart",
        "streamkeeper_airflow.operators.health",
        "streamkeeper_airflow.operators.commands",
    ],
    "sensors": [
        "streamkeeper_airflow.sensors.checkpoints",
        "streamkeeper_airflow.sensors.commands",
    ],
    "triggers": [
        "streamkeeper_airflow.triggers.checkpoints",
        "streamkeeper_airflow.triggers.commands",
        "streamkeeper_airflow.triggers.commits",
        "streamkeeper_airflow.triggers.health",
    ],
}
INTEGRATION = "Streamkeeper"
PACKAGE_NAME = "airflow-provider-streamkeeper"
# The integration's "external-doc-url" names the service integrated with (as Airflow's own
# providers do): Spark Structured Streaming, whose jobs this provider runs.
SPARK_STREAMING_DOCS = "https://spark.apache.org/docs/latest/streaming/index.html"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": PACKAGE_NAME,
        "name": "Streamkeeper",
        "description": "Flink-grade lifecycle for PySpark Structured Streaming jobs: start, "
        "watch checkpoints, savepoints, stop.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "tags": ["service"],
                "external-doc-url": SPARK_STREAMING_DOCS,
            }
        ],
        **{
            kind: [{"integration-name": INTEGRATION, "python-modules": modules}]
            for kind, modules in _MODULES.items()
        },
        "connection-types": [
            {
                "connection-type": "streamkeeper",
                "hook-class-name": "streamkeeper_airflow.hooks.streamkeeper.StreamkeeperHook",
                "hook-name": "Streamkeeper",
                **provider_connection_form(),
            }
        ],
        "extra-links": [
            "streamkeeper_airflow.links.StreamingJobLink",
            "streamkeeper_airflow.links.SparkUILink",
            "streamkeeper_airflow.links.DriverLogLink",
        ],
        "plugins": [
            {
                "name": "streamkeeper",
                "plugin-class": "streamkeeper_airflow.plugin.StreamkeeperPlugin",
            }
        ],
        "notifications": [
            "streamkeeper_airflow.notifications.alerts.StreamkeeperAlertNotifier",
        ],
        "config": {
            "streamkeeper": {
                "description": "Settings of the streamkeeper DAGs and operators.",
                "options": {
                    "jobs_folder": _option(
                        "Folder of job specs (*/job.yaml) the DAGs are generated from.",
                        "/opt/streamkeeper/jobs",
                    ),
                    "workdir": _option(
                        "Working directory of drivers the embedded and spark-submit "
                        "launchers start (relative spec paths resolve there).",
                        "/var/lib/streamkeeper",
                    ),
                    "alert_notifiers": _option(
                        "Airflow notifiers alerts go to besides the task log, as JSON: a "
                        "list of import paths of airflow.sdk.BaseNotifier subclasses or of "
                        '{"class": path, "kwargs": {...}} objects; each is called with the '
                        "task's context plus `alert`. Only this setting may name a class "
                        "(it is code to run). Sensitive (arguments may hold a secret): "
                        "alert_notifiers_secret and alert_notifiers_cmd work too.",
                        '[{"class": "airflow.providers.slack.notifications.slack.'
                        'SlackNotifier", "kwargs": {"slack_conn_id": "slack", "channel": '
                        '"#streaming", "text": "{{ alert.job }}: {{ alert.message }}"}}]',
                        sensitive=True,
                    ),
                    "alert_sink": _option(
                        "Where alerts go besides the task log and alert_notifiers: an "
                        "http(s):// URL (webhook) or, on a single machine only, an absolute "
                        "path or file:// URL (JSON lines, on the host of the task). "
                        "Sensitive (a webhook URL often carries its token): "
                        "alert_sink_secret and alert_sink_cmd work too.",
                        "https://hooks.example/alerts",
                        sensitive=True,
                    ),
                    "first_beat_grace": _option(
                        "Seconds a launched driver may take to beat first (its own beat in "
                        "the control plane) before a start or a wait concludes it never "
                        "started; raise it for pods that pull images.",
                        "180",
                    ),
                    "kubernetes_options": _option(
                        "JSON object of default options of the kubernetes launcher "
                        "(docs/deploying-kubernetes.md); a spec's launcher_options win.",
                        '{"namespace": "streaming", "image": "registry/streamkeeper:0.1.0", '
                        '"service_account": "spark"}',
                    ),
                    "trigger_overrides": _option(
                        "Comma-separated override keys (patterns) a DAG run's Params may "
                        "set beyond the defaults.",
                        "source.path, sinks.*.mode",
                    ),
                    "spark_masters": _option(
                        "Comma-separated Spark masters a DAG run may pick besides the "
                        "spec's own and local ones.",
                        "spark://gateway:7077",
                    ),
                    "driver_env": _option(
                        "Comma-separated worker variables (names or patterns) drivers get "
                        "besides their own.",
                        "NATS_CREDS, MYCOMPANY_*",
                    ),
                    "spec_folders": _option(
                        "Comma-separated folders besides jobs_folder that spec and suite "
                        "paths may point into.",
                        "/opt/releases",
                    ),
                    "ui_conn_id": _option(
                        "Connection the operations page reads job roots with.",
                        "streamkeeper_default",
                    ),
                    "airflow_api_url": _option(
                        "Airflow's API as the operations page reaches it (https unless a "
                        "loopback address); unset: this api-server's own address.",
                        "https://airflow.internal.example",
                    ),
                },
            }
        },
    }


def _option(description: str, example: str, *, sensitive: bool = False) -> dict[str, Any]:
    return {
        "description": description,
        "version_added": "0.1.0",
        "type": "string",
        "example": example,
        "default": None,
        "sensitive": sensitive,
    }
