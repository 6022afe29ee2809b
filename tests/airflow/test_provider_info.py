"""The provider's metadata, as Airflow's ProvidersManager reads it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

from streamkeeper_airflow.errors import ConnectionConfigError
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


FORM = """
import json
from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService
meta = {m.connection_type: m for m in HookMetaService.hook_meta_data()}["streamkeeper"]
print(json.dumps({
    "name": meta.hook_name,
    "standard": json.loads(meta.standard_fields.model_dump_json()),
    "extra": meta.extra_fields,
}))
"""


def test_the_connection_form_has_real_fields(tmp_path: Path) -> None:
    """What Airflow's UI gets for the connection form (its own API service, in a fresh
    interpreter): root, region, role ARN and allow_http as fields, host relabelled,
    schema and port hidden; no raw JSON to type."""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", FORM], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    form = json.loads(done.stdout.strip().splitlines()[-1])
    assert form["name"] == "Streamkeeper"
    extra = form["extra"]
    assert sorted(extra) == ["allow_http", "region", "role_arn", "root"]
    assert extra["role_arn"]["schema"]["title"] == "Role ARN"
    assert extra["root"]["schema"]["title"] == "Storage root"
    assert extra["region"]["value"] == "us-east-1"
    assert extra["allow_http"]["schema"]["type"] == ["boolean", "null"]
    standard = form["standard"]
    assert standard["host"]["title"] == "S3 endpoint URL (empty: AWS)"
    assert standard["url_schema"]["hidden"] and standard["port"]["hidden"]  # schema, port
    assert standard["host"]["placeholder"] == "http://127.0.0.1:8333"


@pytest.mark.parametrize(
    ("root", "valid"),
    [
        ("s3://lake/prod", True),
        ("s3://lake", True),
        ("/var/lib/streamkeeper/data", True),
        ("file:///data/root", True),
        ("relative/path", False),
        ("s3://", False),
        ("http://lake/prod", False),
    ],
)
def test_the_root_field_accepts_what_the_connection_parser_accepts(root: str, valid: bool) -> None:
    from streamkeeper_airflow.connection import ConnectionSettings
    from streamkeeper_airflow.connection_form import ROOT_PATTERN

    assert bool(re.match(ROOT_PATTERN, root)) is valid
    conn = SimpleNamespace(
        conn_id="sk", conn_type="streamkeeper", host=None, port=None, login=None,
        password=None, extra_dejson={"root": root},
    )  # fmt: skip
    if valid:
        assert ConnectionSettings.from_connection(conn).root  # type: ignore[arg-type]
    else:
        with pytest.raises(ConnectionConfigError):
            ConnectionSettings.from_connection(conn)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("role", "valid"),
    [
        ("arn:aws:iam::123456789012:role/streaming", True),
        ("arn:aws-us-gov:iam::123456789012:role/a/b/c-d_e", True),
        ("", True),
        ("streaming", False),
        ("arn:aws:iam::123456789012:user/alice", False),
        ("arn:aws:iam::1234:role/short-account", False),
    ],
)
def test_the_role_field_accepts_what_the_connection_parser_accepts(role: str, valid: bool) -> None:
    from streamkeeper_airflow.connection import ConnectionSettings
    from streamkeeper_airflow.connection_form import CONN_FIELDS

    assert bool(re.fullmatch(CONN_FIELDS["role_arn"]["schema"]["pattern"], role)) is valid
    conn = SimpleNamespace(
        conn_id="sk", conn_type="streamkeeper", host=None, port=None, login=None,
        password=None, extra_dejson={"root": "s3://lake", "role_arn": role},
    )  # fmt: skip
    if valid:
        assert ConnectionSettings.from_connection(conn).role_arn == (role or None)  # type: ignore[arg-type]
    else:
        with pytest.raises(ConnectionConfigError, match="is not a role ARN"):
            ConnectionSettings.from_connection(conn)  # type: ignore[arg-type]
