"""A connection's role ARN, against SeaweedFS's own STS (AssumeRole on its S3 port).

The server knows one static key (the connection's) and two roles it may assume: a writer
and a reader. Every client the product builds (boto3 for the control plane, pyarrow's
file system, delta-rs) must sign with the role's temporary credentials, not the key it
assumed it with: the reader role's writes are refused although the key itself may write.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from streamkeeper.errors import StorageError
from streamkeeper.storage import Location, S3Settings
from streamkeeper.storage.credentials import assumed_role, signing_credentials
from streamkeeper_airflow.connection import ROLE_ARN_VARIABLE, ConnectionSettings

pytestmark = [pytest.mark.integration, pytest.mark.s3]

KEY, SECRET, BUCKET = "roles-admin-key", "roles-admin-secret-0123456789", "roles"
WRITER = "arn:aws:iam::000000000000:role/StreamkeeperWriter"
READER = "arn:aws:iam::000000000000:role/StreamkeeperReader"
NOBODYS = "arn:aws:iam::000000000000:role/SomeoneElses"


def _policy(actions: list[str]) -> dict[str, object]:
    return {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": actions, "Resource": ["*"]}],
    }


def _role(arn: str, policy: str, principal: str = "*") -> dict[str, object]:
    trust = {"Effect": "Allow", "Principal": {"AWS": principal}, "Action": ["sts:AssumeRole"]}
    return {
        "roleName": arn.rsplit("/", 1)[1],
        "roleArn": arn,
        "trustPolicy": {"Version": "2012-10-17", "Statement": [trust]},
        "attachedPolicies": [policy],
    }


IAM_CONFIG = {
    "sts": {
        "tokenDuration": "1h",
        "maxSessionLength": "12h",
        "issuer": "seaweedfs-sts",
        "signingKey": base64.b64encode(b"streamkeeper-test-sts-signing-k!").decode(),
    },
    "policy": {"defaultEffect": "Deny"},
    "policies": [
        {"name": "Write", "document": _policy(["s3:*"])},
        {"name": "Read", "document": _policy(["s3:GetObject", "s3:ListBucket"])},
    ],
    "roles": [
        _role(WRITER, "Write"),
        _role(READER, "Read"),
        _role(NOBODYS, "Write", principal="arn:aws:iam::000000000000:user/someone-else"),
    ],
}


@pytest.fixture(scope="module")
def sts_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from tests.support.services import start_seaweedfs

    place = tmp_path_factory.mktemp("seaweedfs-sts")
    config = place / "iam.json"
    config.write_text(json.dumps(IAM_CONFIG))
    server = start_seaweedfs(place / "data", BUCKET, KEY, SECRET, iam_config=config)
    yield server
    server.stop()


def _connection(server: object, role: str | None) -> ConnectionSettings:
    extra = {"root": f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}", "allow_http": True}
    conn = SimpleNamespace(
        conn_id="sk_roles",
        conn_type="streamkeeper",
        host=server.endpoint_url,  # type: ignore[attr-defined]
        port=None,
        login=KEY,
        password=SECRET,
        extra_dejson={**extra, **({"role_arn": role} if role else {})},
    )
    return ConnectionSettings.from_connection(conn)  # type: ignore[arg-type]


def _refused(call: object) -> str:
    """What the server answered a write the role may not make (403 Access Denied, in
    each client's words)."""
    with pytest.raises(Exception) as caught:  # noqa: PT011 - each client has its own type
        call()  # type: ignore[operator]
    text = str(caught.value)
    assert "AccessDenied" in text or "Access Denied" in text or "403" in text, text
    return text


def test_every_client_signs_with_the_roles_credentials(sts_server: object) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    writer = _connection(sts_server, WRITER)
    root = Location(writer.root, writer.s3_settings())  # type: ignore[arg-type]
    access_key, _, token = signing_credentials(root.s3)  # type: ignore[arg-type]
    assert access_key != KEY and token, "a role's temporary key, with its session token"
    rows = pa.table({"key": ["a", "b"], "total": [1, 2]})
    # The three clients, each as the product builds it, writing with the writer role.
    root.store().write_json("jobs/j/job.json", {"job": "j"})
    write_deltalake(f"{root.uri}/tables/t", rows, storage_options=root.storage_options())
    with root.arrow_filesystem().open_output_stream(f"{root.fs_path}/blob.txt") as out:
        out.write(b"written with the writer role")

    reader = Location(root.uri, _connection(sts_server, READER).s3_settings())
    assert reader.store().read_json("jobs/j/job.json") == {"job": "j"}
    table = DeltaTable(f"{root.uri}/tables/t", storage_options=reader.storage_options())
    assert table.to_pyarrow_table().sort_by("key").equals(rows)
    with reader.arrow_filesystem().open_input_stream(f"{root.fs_path}/blob.txt") as stream:
        assert stream.read() == b"written with the writer role"
    # The reader role may not write, though the key it was assumed with may: each client
    # signs with the role's credentials, not with the key.
    assert "AccessDenied" in _refused(lambda: reader.store().write_json("x.json", {}))
    _refused(
        lambda: write_deltalake(
            f"{root.uri}/tables/r", rows, storage_options=reader.storage_options()
        )
    )  # noqa: E501
    _refused(lambda: reader.arrow_filesystem().open_output_stream(f"{root.fs_path}/r").close())
    keyed = Location(root.uri, _connection(sts_server, None).s3_settings())
    keyed.store().write_json("x.json", {})  # the key alone may write
    assert keyed.store().read_json("x.json") == {}


def test_the_roles_credentials_are_refreshed_before_they_expire(sts_server: object) -> None:
    conn = _connection(sts_server, READER)
    # Credentials for 15 minutes are always within botocore's 15-minute refresh window:
    # each use must take new ones (an hour-long role's are renewed the same way after
    # 45 minutes).
    settings = dataclasses.replace(conn.s3_settings(), role_duration_seconds=900)
    store = Location(conn.root, settings).store()  # type: ignore[arg-type]
    assert store.read_json("nothing-here.json") is None
    first = signing_credentials(settings)[0]
    second = signing_credentials(settings)[0]
    assert first.startswith("ASIA") and second.startswith("ASIA") and first != second
    assert store.read_json("nothing-here.json") is None  # the long-lived client still signs


def test_a_role_the_identity_may_not_assume_names_the_role_and_the_fix(
    sts_server: object,
) -> None:
    settings = _connection(sts_server, NOBODYS).s3_settings()
    with pytest.raises(StorageError) as refused:
        signing_credentials(settings)
    message = str(refused.value)
    assert NOBODYS in message and "trust policy" in message and SECRET not in message


def test_a_driver_gets_the_role_and_reads_it_back(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = SimpleNamespace(
        conn_id="sk", conn_type="streamkeeper", host="http://127.0.0.1:1", port=None,
        login=KEY, password=SECRET,
        extra_dejson={"root": "s3://b/p", "role_arn": WRITER, "aws_session_token": "tok"},
    )  # fmt: skip
    env = ConnectionSettings.from_connection(conn).driver_env()  # type: ignore[arg-type]
    assert env[ROLE_ARN_VARIABLE] == WRITER and env["AWS_SESSION_TOKEN"] == "tok"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    read_back = S3Settings.from_env()
    assert (read_back.role_arn, read_back.session_token, read_back.access_key) == (
        WRITER,
        "tok",
        KEY,
    )


def test_each_role_and_identity_has_one_refreshing_credential(sts_server: object) -> None:
    settings = _connection(sts_server, WRITER).s3_settings()
    assert assumed_role(settings) is assumed_role(settings)
    other = _connection(sts_server, READER).s3_settings()
    assert assumed_role(other) is not assumed_role(settings)


def test_the_test_button_assumes_the_role_and_says_so(
    sts_server: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook
    from tests.airflow.conftest import connection_json

    for conn_id, role in (("sk_writer", WRITER), ("sk_nobody", NOBODYS)):
        value = connection_json(
            f"s3://{BUCKET}/button",
            host=sts_server.endpoint_url,  # type: ignore[attr-defined]
            login=KEY,
            password=SECRET,
            role_arn=role,
            allow_http=True,
        )
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", value)
    ok, said = StreamkeeperHook("sk_writer").test_connection()
    assert ok and f"assumed role {WRITER}" in said and "write and delete below it: ok" in said
    ok, said = StreamkeeperHook("sk_nobody").test_connection()
    assert not ok and f"could not assume role {NOBODYS!r}" in said and SECRET not in said
