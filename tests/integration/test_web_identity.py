"""IRSA-style credentials (a web identity token file and a role) reach the driver as they
are, and the driver's storage clients assume the role with them: AssumeRoleWithWebIdentity
against SeaweedFS's own STS, nothing emulated.

The identity provider is this module's: an RSA key whose JWKS a tiny HTTP server serves
on 127.0.0.1, and tokens signed with it as Kubernetes signs a service account's (issuer,
`sub` = the service account, audience `sts.amazonaws.com`). SeaweedFS (`weed mini` with
`-s3.iam.config`) knows that issuer as an OIDC provider, fetches its JWKS, checks each
token's signature, issuer, audience and expiry, and the roles' trust policies admit only
the driver's service account. A writer role may write; a reader role may only read.

The Airflow worker's environment holds `AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ROLE_ARN` and
`AWS_ROLE_SESSION_NAME`; the connection gives the endpoint and no key. The driver is a
real process started with exactly the environment `driver_environment` gives it, using
the clients the product builds (boto3 for the control plane, delta-rs, pyarrow).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from streamkeeper.storage import S3Settings
from streamkeeper.storage.credentials import signing_credentials
from streamkeeper_airflow.connection import ROLE_ARN_VARIABLE, ConnectionSettings
from streamkeeper_airflow.launchers.base import LaunchRequest, driver_environment

pytestmark = [pytest.mark.integration, pytest.mark.s3]

KEY, SECRET, BUCKET = "wi-admin-key", "wi-admin-secret-0123456789", "webidentity"
PROVIDER = "streaming-cluster-oidc"
AUDIENCE = "sts.amazonaws.com"  # what EKS puts in a projected service account token
DRIVER_ACCOUNT = "system:serviceaccount:streaming:streamkeeper-driver"
WRITER = "arn:aws:iam::000000000000:role/StreamkeeperWebWriter"
READER = "arn:aws:iam::000000000000:role/StreamkeeperWebReader"
WEB_IDENTITY = ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME")
STATIC_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


@dataclass
class IdentityProvider:
    """An OIDC issuer on 127.0.0.1: its JWKS at /jwks, tokens signed with its key."""

    issuer: str
    key: Any
    server: HTTPServer

    def token(self, key: Any = None, **claims: Any) -> str:
        import jwt

        now = int(time.time())
        body = {"iss": self.issuer, "sub": DRIVER_ACCOUNT, "aud": AUDIENCE}
        body |= {"iat": now, "nbf": now - 5, "exp": now + 3600, **claims}
        return jwt.encode(body, key or self.key, algorithm="RS256", headers={"kid": "driver-1"})


@pytest.fixture(scope="module")
def idp() -> Iterator[IdentityProvider]:
    from cryptography.hazmat.primitives.asymmetric import rsa
    from jwt.algorithms import RSAAlgorithm

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    jwks = json.dumps({"keys": [{**jwk, "kid": "driver-1", "alg": "RS256", "use": "sig"}]})

    class Jwks(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/jwks" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(jwks.encode() if self.path == "/jwks" else b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Jwks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield IdentityProvider(f"http://127.0.0.1:{server.server_address[1]}", key, server)
    server.shutdown()


def _web_role(arn: str, policy: str) -> dict[str, Any]:
    """A role for the driver's service account of our cluster (as an IRSA trust policy)."""
    trust = {
        "Effect": "Allow",
        "Principal": {"Federated": PROVIDER},
        "Action": ["sts:AssumeRoleWithWebIdentity"],
        "Condition": {"StringEquals": {"oidc:sub": DRIVER_ACCOUNT}},
    }
    return {
        "roleName": arn.rsplit("/", 1)[1],
        "roleArn": arn,
        "trustPolicy": {"Version": "2012-10-17", "Statement": [trust]},
        "attachedPolicies": [policy],
    }


def _policy(actions: list[str]) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": actions, "Resource": ["*"]}],
    }


@pytest.fixture(scope="module")
def sts_server(idp: IdentityProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.support.services import start_seaweedfs

    config = {
        "sts": {
            "tokenDuration": "1h",
            "maxSessionLength": "12h",
            "issuer": "seaweedfs-sts",
            "signingKey": base64.b64encode(b"streamkeeper-web-identity-sign-k").decode(),
        },
        "providers": [
            {
                "name": PROVIDER,
                "type": "oidc",
                "enabled": True,
                "config": {
                    "issuer": idp.issuer,
                    "clientId": AUDIENCE,
                    "jwksUri": f"{idp.issuer}/jwks",
                },
            }
        ],
        "policy": {"defaultEffect": "Deny"},
        "policies": [
            {"name": "Write", "document": _policy(["s3:*"])},
            {"name": "Read", "document": _policy(["s3:GetObject", "s3:ListBucket"])},
        ],
        "roles": [_web_role(WRITER, "Write"), _web_role(READER, "Read")],
    }
    place = tmp_path_factory.mktemp("seaweedfs-web-identity")
    (place / "iam.json").write_text(json.dumps(config))
    server = start_seaweedfs(place / "data", BUCKET, KEY, SECRET, iam_config=place / "iam.json")
    yield server
    server.stop()


def _keyless_connection(endpoint: str | None, root: str) -> ConnectionSettings:
    """The job's connection: the endpoint and root, no key, no role of its own."""
    conn = SimpleNamespace(
        conn_id="sk_irsa",
        conn_type="streamkeeper",
        host=endpoint,
        port=None,
        login=None,
        password=None,
        extra_dejson={"root": root, "allow_http": True},
    )
    return ConnectionSettings.from_connection(conn)  # type: ignore[arg-type]


def _worker_env(home: Path, token_file: Path, role: str, session: str) -> dict[str, str]:
    """An Airflow worker's environment on a cluster with IRSA-style credentials."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),  # no ~/.aws of this machine's
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(token_file),
        "AWS_ROLE_ARN": role,
        "AWS_ROLE_SESSION_NAME": session,
        "AWS_EC2_METADATA_DISABLED": "true",  # no instance metadata service here to ask
        "AIRFLOW__CORE__FERNET_KEY": "not-for-drivers-0123456789",  # a worker secret
    }


def _driver_env(worker: dict[str, str], conn: ConnectionSettings) -> dict[str, str]:
    request = LaunchRequest(
        job="j",
        spec_path="job.yaml",
        root=conn.root or "",
        run_token="t",
        workdir="/tmp",
        env=conn.driver_env(),
    )
    return driver_environment(request, worker)


def test_the_driver_gets_the_web_identity_as_it_is_and_no_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    worker = _worker_env(tmp_path, token_file, WRITER, "streamkeeper-driver-7")
    for endpoint in ("http://s3.internal.example:8333", None):  # a store's, or AWS itself
        conn = _keyless_connection(endpoint, "s3://bucket/prefix")
        env = _driver_env(worker, conn)
        assert {name: env.get(name) for name in WEB_IDENTITY} == {
            name: worker[name] for name in WEB_IDENTITY
        }
        for invented in (*STATIC_KEYS, ROLE_ARN_VARIABLE):
            assert invented not in env, f"{invented} appeared in the driver's environment"
        assert env.get("AWS_ENDPOINT_URL") == endpoint
        assert "AIRFLOW__CORE__FERNET_KEY" not in env
        # The driver reads no key and no role of its own: the default chain (web
        # identity) is every client's, each resolving it itself.
        with monkeypatch.context() as driver:
            for name in os.environ:
                if name.startswith(("AWS_", "STREAMKEEPER_")):
                    driver.delenv(name)
            for name, value in env.items():
                driver.setenv(name, value)
            read_back = S3Settings.from_env()
        assert (read_back.access_key, read_back.role_arn) == (None, None)
        assert read_back.endpoint_url == endpoint
        assert signing_credentials(read_back) == (None, None, None)


DRIVER = r"""
import json, os, sys

import boto3
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from streamkeeper.storage import Location, S3Settings
from streamkeeper.storage.credentials import signing_credentials

uri, label = sys.argv[1], sys.argv[2]
settings = S3Settings.from_env()
root = Location(uri, settings)
credentials = boto3.Session().get_credentials()
report = {
    "access_key": settings.access_key,
    "role_arn": settings.role_arn,
    "handed": [value is not None for value in signing_credentials(settings)],
    "boto3_method": credentials.method if credentials else None,
}


def attempt(name, action):
    try:
        report[name] = ["ok", action()]
    except Exception as error:
        report[name] = ["refused", f"{type(error).__name__}: {error}"[:600]]


sts = boto3.client("sts", endpoint_url=settings.endpoint_url, region_name=settings.region)
attempt("caller", lambda: sts.get_caller_identity()["Arn"])
rows = pa.table({"key": ["a", "b"], "total": [1, 2]})
attempt("control_plane_write", lambda: root.store().write_json(f"jobs/{label}.json", {"by": label}))
attempt("control_plane_read", lambda: root.store().read_json("jobs/writer.json"))
attempt("delta_write", lambda: write_deltalake(
    f"{uri}/tables/{label}", rows, storage_options=root.storage_options()))
attempt("delta_read", lambda: DeltaTable(
    f"{uri}/tables/writer", storage_options=root.storage_options()
).to_pyarrow_dataset().to_table(use_threads=False).num_rows)


def arrow_write():
    with root.arrow_filesystem().open_output_stream(f"{root.fs_path}/blobs/{label}") as out:
        out.write(b"parquet would go here")


attempt("pyarrow_write", arrow_write)
print(json.dumps(report), flush=True)
os._exit(0)  # not delta-rs's runtime shutdown after a refused upload (it panics at exit)
"""


@pytest.fixture(scope="module")
def driver_runs(
    idp: IdentityProvider, sts_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """One driver process per role (the writer first), each started with the environment
    `driver_environment` makes of the worker's and the keyless connection's."""
    place = tmp_path_factory.mktemp("web-identity-driver")
    token_file = place / "token"  # as the kubelet projects it
    token_file.write_text(idp.token())
    root = f"s3://{BUCKET}/irsa-{uuid.uuid4().hex[:8]}"
    conn = _keyless_connection(sts_server.endpoint_url, root)
    runs: dict[str, dict[str, Any]] = {"root": {"uri": root}}
    for label, role in (("writer", WRITER), ("reader", READER)):
        worker = _worker_env(place, token_file, role, f"streamkeeper-driver-{label}")
        env = _driver_env(worker, conn)
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, root, label],
            env=env,
            cwd=place,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0 and done.stdout.strip(), done.stderr[-3000:]
        runs[label] = json.loads(done.stdout.strip().splitlines()[-1])
    return runs


def test_the_driver_assumes_the_role_by_web_identity_and_the_roles_limits_apply(
    driver_runs: dict[str, dict[str, Any]], sts_server: Any
) -> None:
    writer, reader = driver_runs["writer"], driver_runs["reader"]
    for label, run, role in (("writer", writer, "StreamkeeperWebWriter"),
                             ("reader", reader, "StreamkeeperWebReader")):  # fmt: skip
        # No key was given to the driver or made up for it: boto3 found the token file
        # and the role, and asked STS (at the connection's endpoint) for credentials,
        # which pyarrow and delta-rs are handed (storage/credentials.py: key, secret and
        # session token of botocore's chain).
        assert (run["access_key"], run["role_arn"], run["handed"]) == (None, None, [True] * 3)
        assert run["boto3_method"] == "assume-role-with-web-identity"
        assert run["caller"][0] == "ok"
        assert run["caller"][1].endswith(f":assumed-role/{role}/streamkeeper-driver-{label}")
    # The writer role writes through the control plane's client and delta-rs ...
    assert writer["control_plane_write"] == ["ok", None]
    assert writer["delta_write"] == ["ok", None]
    assert writer["control_plane_read"] == ["ok", {"by": "writer"}]
    assert writer["delta_read"] == ["ok", 2]
    # ... which the store's own admin sees, as written.
    key = f"{driver_runs['root']['uri'].removeprefix(f's3://{BUCKET}/')}/jobs/writer.json"
    stored = sts_server.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
    assert json.loads(stored) == {"by": "writer"}
    # The reader role reads all of it, and every write of its is refused by the store.
    assert reader["control_plane_read"] == ["ok", {"by": "writer"}]
    assert reader["delta_read"] == ["ok", 2]
    for refused in ("control_plane_write", "delta_write", "pyarrow_write"):
        outcome, message = reader[refused]
        denied = any(word in message for word in ("AccessDenied", "ACCESS_DENIED", "403"))
        assert outcome == "refused" and denied, (refused, message)


def test_pyarrow_in_the_driver_writes_with_the_web_identity_role(
    driver_runs: dict[str, dict[str, Any]],
) -> None:
    assert driver_runs["writer"]["pyarrow_write"] == ["ok", None]


def test_the_stores_sts_checks_the_token_and_the_trust_policy(
    idp: IdentityProvider, sts_server: Any
) -> None:
    """A forged, expired or foreign token, or another service account's, gets nothing:
    the credentials above came from a real check, not a stub."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError
    from cryptography.hazmat.primitives.asymmetric import rsa

    sts = boto3.client(
        "sts",
        endpoint_url=sts_server.endpoint_url,
        region_name="us-east-1",
        config=Config(signature_version=UNSIGNED),
    )
    assumed = sts.assume_role_with_web_identity(
        RoleArn=WRITER, RoleSessionName="checked", WebIdentityToken=idp.token()
    )
    assert assumed["Credentials"]["AccessKeyId"].startswith("ASIA")
    now = int(time.time())
    impostor = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    refusals = {
        "signed by another key": (idp.token(key=impostor), "signature"),
        "for another audience": (idp.token(aud="some-other-client"), "audience"),
        "expired": (idp.token(iat=now - 7200, nbf=now - 7200, exp=now - 3600), "expired"),
        "another service account": (
            idp.token(sub="system:serviceaccount:streaming:someone-else"),
            "trust policy",
        ),
    }
    for what, (token, reason) in refusals.items():
        with pytest.raises(ClientError) as refused:
            sts.assume_role_with_web_identity(
                RoleArn=WRITER, RoleSessionName="checked", WebIdentityToken=token
            )
        assert reason in str(refused.value), (what, str(refused.value))


def test_the_workers_sts_endpoint_reaches_the_driver(tmp_path: Path) -> None:
    worker = _worker_env(tmp_path, tmp_path / "token", WRITER, "s")
    worker["AWS_ENDPOINT_URL_STS"] = "https://sts.us-east-1.amazonaws.com"
    conn = _keyless_connection(
        "https://bucket.vpce-0a1b.s3.us-east-1.vpce.amazonaws.com", "s3://b/p"
    )
    env = _driver_env(worker, conn)
    assert env.get("AWS_ENDPOINT_URL_STS") == worker["AWS_ENDPOINT_URL_STS"]
