"""The connection format, and that no credential leaks through repr, logs or exceptions."""

from __future__ import annotations

import json
import logging
import traceback
from pathlib import Path

import pytest
from airflow.sdk import Connection

from streamkeeper_airflow.connection import ConnectionSettings
from streamkeeper_airflow.errors import ConnectionConfigError, SecretSafeError
from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook
from streamkeeper_airflow.secrets import redact, secrets_hidden
from tests.airflow.conftest import CANARY_KEY, CANARY_SECRET
from tests.unit.test_client import JOB, write_control_plane


def _conn(conn_type: str = "streamkeeper", **fields: object) -> Connection:
    extra = fields.pop("extra", {"root": "s3://lake/prod"})
    return Connection(
        conn_id="sk",
        conn_type=conn_type,
        extra=json.dumps(extra) if isinstance(extra, dict) else extra,
        **fields,  # type: ignore[arg-type]
    )


def test_a_streamkeeper_connection_is_an_endpoint_keys_and_a_root() -> None:
    settings = ConnectionSettings.from_connection(
        _conn(
            host="http://127.0.0.1:8333",
            login=CANARY_KEY,
            password=CANARY_SECRET,
            extra={"root": "s3://lake/prod/", "region": "eu-west-1"},
        )
    )
    assert settings.root == "s3://lake/prod"
    assert (settings.endpoint_url, settings.region, settings.allow_http) == (
        "http://127.0.0.1:8333",
        "eu-west-1",
        True,
    )
    assert (settings.access_key, settings.secret_key) == (CANARY_KEY, CANARY_SECRET)
    assert settings.driver_env() == {
        "AWS_REGION": "eu-west-1",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
        "AWS_ACCESS_KEY_ID": CANARY_KEY,
        "AWS_SECRET_ACCESS_KEY": CANARY_SECRET,
    }
    s3 = settings.s3_settings()
    assert (s3.access_key, s3.secret_key, s3.endpoint_url) == (
        CANARY_KEY,
        CANARY_SECRET,
        "http://127.0.0.1:8333",
    )
    for text in (repr(settings), str(settings), repr(s3)):
        assert CANARY_SECRET not in text and CANARY_KEY not in text


def test_a_host_without_scheme_gets_one_and_the_port() -> None:
    settings = ConnectionSettings.from_connection(
        _conn(host="minio.local", port=9000, extra={"root": "s3://b/p", "allow_http": "true"})
    )
    assert settings.endpoint_url == "http://minio.local:9000" and settings.allow_http


def test_an_aws_connection_is_read_too() -> None:
    settings = ConnectionSettings.from_connection(
        _conn(
            "aws",
            host="ignored",
            extra={
                "aws_access_key_id": CANARY_KEY,
                "aws_secret_access_key": CANARY_SECRET,
                "endpoint_url": "https://s3.example.com/",
                "region_name": "us-west-2",
                "root": "s3://lake",
            },
        )
    )
    assert (settings.access_key, settings.secret_key) == (CANARY_KEY, CANARY_SECRET)
    assert (settings.endpoint_url, settings.region, settings.root) == (
        "https://s3.example.com",
        "us-west-2",
        "s3://lake",
    )
    assert not settings.allow_http


def test_an_aws_connections_session_token_and_role_reach_every_client_and_the_driver() -> None:
    role = "arn:aws-cn:iam::123456789012:role/streaming/jobs"
    extra = {"aws_session_token": CANARY_SECRET + "-token", "role_arn": role, "root": "s3://l"}
    settings = ConnectionSettings.from_connection(
        _conn("aws", login=CANARY_KEY, password=CANARY_SECRET, extra=extra)
    )
    s3 = settings.s3_settings()
    assert (s3.role_arn, s3.session_token) == (role, CANARY_SECRET + "-token")
    assert CANARY_SECRET + "-token" in settings.secrets  # redacted wherever text is shown
    env = settings.driver_env()
    assert env["STREAMKEEPER_S3_ROLE_ARN"] == role
    assert env["AWS_SESSION_TOKEN"] == CANARY_SECRET + "-token"
    assert CANARY_SECRET not in repr(settings) and CANARY_SECRET not in repr(s3)


def test_a_local_root_needs_no_credentials(tmp_path: Path) -> None:
    settings = ConnectionSettings.from_connection(_conn("generic", extra={"root": str(tmp_path)}))
    assert settings.root == str(tmp_path) and settings.secrets == ()
    assert settings.driver_env() == {"AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "false"}


@pytest.mark.parametrize(
    ("conn", "expected"),
    [
        (_conn("postgres", password=CANARY_SECRET), "has type 'postgres'; expected 'streamkeeper'"),
        (_conn(password=CANARY_SECRET, extra={"root": "data/here"}), "neither s3://bucket"),
        (_conn(password=CANARY_SECRET, extra={"root": "s3://"}), "has no bucket"),
        (_conn(password=CANARY_SECRET, extra={"root": "gs://b/p"}), "neither s3://bucket"),
        (_conn(password=CANARY_SECRET, extra={"allow_http": "maybe"}), "extra.allow_http is"),
        (_conn(password=CANARY_SECRET, extra="[1, 2]"), "extra is not a JSON object"),
        (
            _conn(password=CANARY_SECRET, extra={"root": "s3://b", "role_arn": "streaming"}),
            "extra.role_arn 'streaming' is not a role ARN; expected arn:aws:iam::",
        ),
    ],
)
def test_a_bad_connection_names_the_field_and_the_fix_never_the_secret(
    conn: Connection, expected: str
) -> None:
    with pytest.raises(ConnectionConfigError) as caught:
        ConnectionSettings.from_connection(conn)
    message = str(caught.value)
    assert expected in message and "'sk'" in message
    assert CANARY_SECRET not in message


def test_a_hook_without_a_root_says_where_to_set_it(conn_env: object) -> None:
    conn_env("sk_noroot", "")  # type: ignore[operator]
    with pytest.raises(ConnectionConfigError, match=r'extra to \{"root": "s3://bucket/prefix"'):
        StreamkeeperHook("sk_noroot").root  # noqa: B018


def test_the_hook_reads_a_control_plane_and_logs_no_credential(
    conn_env: object, local_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_control_plane(local_root, seqs=range(5), history_files=1)
    conn_env("sk_local", str(local_root))  # type: ignore[operator]
    caplog.set_level(logging.DEBUG)
    hook = StreamkeeperHook("sk_local")
    assert hook.jobs() == [JOB]
    assert hook.head_seq(JOB) == 4
    assert hook.checkpoints_after(JOB, 2) == [3, 4]
    assert hook.checkpoints_after(JOB, -1) == [0, 1, 2, 3, 4]
    assert hook.status("never-ran", missing_ok=True) is None
    assert hook.head_seq("never-ran") == -1
    assert hook.job_record(JOB).lineage == JOB  # type: ignore[union-attr]
    assert [c.checkpoint_id for c in hook.history(JOB, last=2)] == [3, 4]
    ok, message = hook.test_connection()
    assert ok, message
    assert message == f"root {local_root}; write and delete below it: ok; 1 job(s): {JOB}"
    for text in (caplog.text, repr(hook), repr(hook.settings), repr(hook.client.location)):
        assert CANARY_SECRET not in text and CANARY_KEY not in text


def test_an_error_quoting_a_credential_is_raised_redacted(
    conn_env: object, local_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_control_plane(local_root, seqs=range(1), history_files=1)
    conn_env("sk_leak", str(local_root))  # type: ignore[operator]
    hook = StreamkeeperHook("sk_leak")

    def leaky(job: str) -> None:
        try:
            raise KeyError(f"signature for {CANARY_KEY}:{CANARY_SECRET} refused")
        except KeyError as inner:
            raise RuntimeError("request failed") from inner  # the secret is in the cause

    monkeypatch.setattr(hook.client, "status", leaky)
    with pytest.raises(SecretSafeError) as caught:
        hook.status(JOB)
    printed = "".join(traceback.format_exception(caught.value))
    assert "RuntimeError: request failed" in str(caught.value)
    assert CANARY_SECRET not in printed and CANARY_KEY not in printed

    monkeypatch.setattr(hook.client, "status", lambda job: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # an error without a secret is left alone
        hook.status(JOB)


def test_redact_masks_given_secrets_url_passwords_and_secret_pairs() -> None:
    text = (
        f"key {CANARY_KEY} secret {CANARY_SECRET} at http://user:pw@host/x "
        'AWS_SECRET_ACCESS_KEY=abc {"password": "hunter2"} run_token=af-123'
    )
    masked = redact(text, [CANARY_SECRET, CANARY_KEY, None])
    assert CANARY_SECRET not in masked and CANARY_KEY not in masked
    assert "user:pw" not in masked and "abc" not in masked and "hunter2" not in masked
    assert "run_token=af-123" in masked  # an id, not a credential
    with pytest.raises(SecretSafeError), secrets_hidden([CANARY_SECRET]):
        raise ValueError(f"bad {CANARY_SECRET}")


def test_the_test_button_says_what_it_checked_and_where_it_failed(conn_env: object) -> None:
    """An endpoint nobody listens on: the button names the root and the endpoint it
    tried, and the failure, never the secret."""
    conn_env("sk_down", "s3://lake/prod", host="http://127.0.0.1:9")  # type: ignore[operator]
    ok, message = StreamkeeperHook("sk_down").test_connection()
    assert not ok
    assert message.startswith("root s3://lake/prod at http://127.0.0.1:9; failed: ")
    assert "cannot reach object storage" in message
    assert CANARY_SECRET not in message and CANARY_KEY not in message
