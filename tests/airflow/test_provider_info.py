"""The provider's metadata, as Airflow's ProvidersManager reads it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema

from streamkeeper_airflow.provider import get_provider_info

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "streamkeeper_airflow"
_READ = re.compile(r"\boption(?:_list)?\(\s*\"(\w+)\"")


def test_the_provider_info_is_valid_for_airflows_schema() -> None:
    import airflow

    schema_path = Path(airflow.__file__).parent / "provider_info.schema.json"
    jsonschema.validate(get_provider_info(), json.loads(schema_path.read_text()))


def test_every_streamkeeper_option_the_code_reads_is_declared() -> None:
    read = {name for path in PACKAGE.rglob("*.py") for name in _READ.findall(path.read_text())}
    declared = set(get_provider_info()["config"]["streamkeeper"]["options"])
    assert {"jobs_folder", "ui_conn_id", "airflow_api_url", "alert_sink"} <= read
    assert read - declared == set(), f"read but not declared: {sorted(read - declared)}"


def test_the_alert_webhook_can_come_from_a_command_or_a_secret(tmp_path: Path) -> None:
    """A webhook URL carries its token: declared sensitive, `alert_sink_cmd` (and
    `_secret`) work, so it need not sit in airflow.cfg or a plain variable."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("AIRFLOW__STREAMKEEPER__")
    }
    env |= {
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__STREAMKEEPER__ALERT_SINK_CMD": "echo https://hooks.example/T0K3N",
    }
    code = "from streamkeeper_airflow import settings; print(settings.alert_sink())"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "https://hooks.example/T0K3N"
