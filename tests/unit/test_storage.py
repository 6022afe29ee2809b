"""Storage URIs, path confinement, the local object store and S3 settings."""

from __future__ import annotations

import importlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse

from streamkeeper.errors import StorageError
from streamkeeper.spec import StorageSpec
from streamkeeper.storage import (
    LocalStore,
    Location,
    S3Settings,
    S3Store,
    join_under,
    probe,
    resolve_root,
)


@pytest.mark.parametrize("relative", ["..", "../x", "a/../../x", "a/b/../../../etc", ".", ""])
def test_join_under_refuses_escapes(relative: str) -> None:
    with pytest.raises(StorageError, match="escapes its root") as caught:
        join_under("s3://bucket/root", relative)
    assert repr(relative) in str(caught.value)
    assert "'s3://bucket/root'" in str(caught.value)


@pytest.mark.parametrize(
    ("root", "relative", "joined"),
    [
        ("/data/root", "tables/t", "/data/root/tables/t"),
        ("/data/root/", "a/./b/../c", "/data/root/a/c"),
        ("s3://bucket/p", "tables/t", "s3://bucket/p/tables/t"),
        ("/data/root", "s3://other/t", "s3://other/t"),
        ("/data/root", "/elsewhere/t", "/elsewhere/t"),
    ],
)
def test_join_under_joins_and_passes_absolute_uris(root: str, relative: str, joined: str) -> None:
    assert join_under(root, relative) == joined


def test_location_child_is_confined() -> None:
    root = Location("s3://bucket/prefix")
    assert root.child("tables/t").uri == "s3://bucket/prefix/tables/t"
    assert root.child("tables/t").fs_path == "bucket/prefix/tables/t"
    with pytest.raises(StorageError):
        root.child("../other")


def test_resolve_root_makes_local_paths_absolute(tmp_path: Path) -> None:
    assert resolve_root("data/root", base_dir=tmp_path) == str(tmp_path.resolve() / "data/root")
    assert resolve_root(f"file://{tmp_path}/x") == str(tmp_path.resolve() / "x")
    assert resolve_root(str(tmp_path / "a" / ".." / "b")) == str(tmp_path.resolve() / "b")


def test_resolve_root_relative_defaults_to_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_root("rel") == str(tmp_path.resolve() / "rel")


def test_resolve_root_s3() -> None:
    assert resolve_root("s3://bucket/prefix/") == "s3://bucket/prefix"
    with pytest.raises(StorageError, match="has no bucket") as caught:
        resolve_root("s3:///prefix")
    assert "'s3:///prefix'" in str(caught.value)


@pytest.mark.parametrize("uri", ["gs://bucket/p", "hdfs://nn/p", "http://host/p"])
def test_resolve_root_refuses_other_schemes(uri: str) -> None:
    with pytest.raises(StorageError, match="unsupported storage URI") as caught:
        resolve_root(uri)
    assert repr(uri) in str(caught.value)


def test_local_store_round_trip(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    assert store.read_json("a/b.json") is None
    assert not store.exists("a/b.json")
    store.write_json("a/b.json", {"x": 1})
    assert store.read_json("a/b.json") == {"x": 1}
    store.write_json("a/b.json", {"x": 2})  # write overwrites
    assert store.read_json("a/b.json") == {"x": 2}
    assert store.exists("a/b.json")


def test_local_store_create_is_put_if_absent(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    assert store.create_json("e/1.json", {"owner": "first"}) is True
    assert store.create_json("e/1.json", {"owner": "second"}) is False
    assert store.read_json("e/1.json") == {"owner": "first"}
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == ["1.json"]  # no temp files left


def test_local_store_list_is_sorted_and_prefix_scoped(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    for key in ["m/10.json", "m/02.json", "m/sub/01.json", "mm/01.json", "other.json"]:
        store.write_json(key, {})
    (tmp_path / "m" / ".hidden.tmp").write_text("{}")  # a write in progress
    (tmp_path / "m" / ".02.json.lock").write_text("")
    assert store.list("m") == ["m/02.json", "m/10.json", "m/sub/01.json"]
    # Other names starting with a dot are keys (Spark's checksums in a savepoint).
    (tmp_path / "m" / ".1.delta.crc").write_text("{}")
    assert store.list("m")[0] == "m/.1.delta.crc"
    assert store.list("missing") == []


def test_local_store_delete_folder_takes_what_a_killed_write_left(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_json("sp/1/manifest.json", {})
    store.write_json("sp/2/manifest.json", {})
    (tmp_path / "sp" / "1" / "checkpoint").mkdir()
    (tmp_path / "sp" / "1" / "checkpoint" / ".0.3c6c940fd44c4a06a3b28a258bf3395b.tmp").write_text(
        ""
    )
    store.delete_folder("sp/1")
    assert store.children("sp") == ["2"] and store.list("sp") == ["sp/2/manifest.json"]
    with pytest.raises(ValueError, match="not the root"):
        store.delete_folder("")


def test_local_store_delete(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_json("d/1.json", {})
    store.write_json("d/2.json", {})
    store.delete(["d/1.json", "d/never-existed.json"])
    assert store.list("d") == ["d/2.json"]


def test_storage_options_empty_for_local() -> None:
    assert Location("/data/root", S3Settings(endpoint_url="http://x:1")).storage_options() == {}


def test_storage_options_for_s3_carry_endpoint_and_credentials() -> None:
    settings = S3Settings(
        endpoint_url="http://127.0.0.1:8333",
        region="eu-west-1",
        access_key="AK",
        secret_key="SK",
        allow_http=True,
    )
    options = Location("s3://bucket/p", settings).storage_options()
    assert options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:8333"
    assert options["AWS_REGION"] == "eu-west-1"
    assert options["AWS_ACCESS_KEY_ID"] == "AK"
    assert options["AWS_SECRET_ACCESS_KEY"] == "SK"
    assert options["AWS_ALLOW_HTTP"] == "true"
    assert options["AWS_CONDITIONAL_PUT"] == "etag"


def test_s3_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-ak")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-sk")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    settings = S3Settings.from_env()
    assert settings.endpoint_url == "http://127.0.0.1:9000"
    assert (settings.access_key, settings.secret_key) == ("env-ak", "env-sk")
    assert settings.region == "ap-south-1"
    assert settings.allow_http is True  # inferred from the http:// endpoint
    assert "env-sk" not in repr(settings)


def test_s3_settings_spec_wins_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:1")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    spec = StorageSpec(endpoint_url="https://spec:2", region="eu-central-1", allow_http=False)
    settings = S3Settings.from_env(spec)
    assert settings.endpoint_url == "https://spec:2"
    assert settings.region == "eu-central-1"
    assert settings.allow_http is False


def test_s3_settings_defaults_without_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_ALLOW_HTTP",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ]:
        monkeypatch.delenv(name, raising=False)
    settings = S3Settings.from_env()
    assert settings == S3Settings(region="us-east-1", allow_http=False)


def test_probe_local_ok_and_leaves_nothing(tmp_path: Path) -> None:
    probe(Location(str(tmp_path)))
    assert LocalStore(tmp_path).list("_probe") == []


def test_probes_of_two_drivers_starting_together_do_not_fail_each_other(tmp_path: Path) -> None:
    other = LocalStore(tmp_path)
    other.write_json("_probe/other-driver.json", {"probe": True})  # mid-probe
    probe(Location(str(tmp_path)))
    assert other.list("_probe") == ["_probe/other-driver.json"]  # not this probe's to remove


def test_probe_local_unwritable_names_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="cannot write to") as caught:
        probe(Location(str(blocker)))
    assert str(blocker) in str(caught.value)


# -- the S3 probe: transient errors are retried, refusals are final ----------------------

PROBE = importlib.import_module("streamkeeper.storage.probe")  # the package re-exports `probe`
Outcome = BaseException | tuple[int, bytes]


def _s3_location(endpoint: str = "http://127.0.0.1:9") -> Location:
    settings = S3Settings(
        endpoint_url=endpoint, region="us-east-1", access_key="ak", secret_key="sk", allow_http=True
    )
    return Location("s3://bucket/prefix", settings)


def _s3_error(code: str, status: int) -> tuple[int, bytes]:
    body = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
    return status, body


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: object) -> Iterator[bytes]:
        yield self.body


class ScriptedS3:
    """Answers the probe's HTTP requests from a script, inside botocore (no server).

    Each outcome is an exception (raised where the HTTP send would be, so botocore's
    own error handling sees it) or an HTTP status and body.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, outcomes: list[Outcome]) -> None:
        self.outcomes = list(outcomes)
        self.requests: list[str] = []
        self.store = S3Store(_s3_location(), fail_fast=True)
        self.store.client.meta.events.register_first("before-send.s3", self._answer)
        monkeypatch.setattr(PROBE, "S3Store", lambda location, fail_fast: self.store)

    def _answer(self, request: AWSPreparedRequest, **_: object) -> AWSResponse:
        self.requests.append(request.method)
        if not self.outcomes:
            raise AssertionError(f"unexpected request {request.method} {request.url}")
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        status, body = outcome
        return AWSResponse(request.url, status, {}, _Raw(body))


OK_HEAD, OK_PUT = (200, b""), (200, b"")
OK_DELETE = (200, b"<DeleteResult></DeleteResult>")


def test_probe_retries_transient_errors_then_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.exceptions import ConnectionClosedError, EndpointConnectionError

    endpoint = "http://127.0.0.1:9"
    script = ScriptedS3(
        monkeypatch,
        [
            EndpointConnectionError(endpoint_url=endpoint),
            ConnectionClosedError(endpoint_url=endpoint),
            OK_HEAD,
            _s3_error("ServiceUnavailable", 503),  # the PUT fails once: the attempt restarts
            OK_HEAD,
            OK_PUT,
            OK_DELETE,
        ],
    )
    probe(_s3_location(endpoint))
    assert script.outcomes == []
    assert script.requests[-3:] == ["HEAD", "PUT", "POST"]


def test_probe_retries_even_when_one_slow_attempt_used_the_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a loaded machine one attempt can outlast the retry window; a transient error
    answered then must still be retried (a start failed in CI this way)."""
    script = ScriptedS3(
        monkeypatch,
        [_s3_error("SlowDown", 503), _s3_error("InternalError", 500), OK_HEAD, OK_PUT, OK_DELETE],
    )
    probe(_s3_location(), retry_seconds=0.0)  # the window is over after the first attempt
    assert script.outcomes == []
    assert script.requests == ["HEAD", "HEAD", "HEAD", "PUT", "POST"]


@pytest.mark.parametrize(
    ("outcomes", "message"),
    [
        ([(403, b"")], "refused the credentials"),  # HEAD answers have no body: just 403
        ([OK_HEAD, _s3_error("InvalidAccessKeyId", 403)], "InvalidAccessKeyId"),
        ([OK_HEAD, _s3_error("SignatureDoesNotMatch", 403)], "SignatureDoesNotMatch"),
        ([(404, b"")], "bucket 'bucket' does not exist"),
        ([OK_HEAD, _s3_error("NoSuchBucket", 404)], "bucket 'bucket' does not exist"),
    ],
)
def test_probe_fails_fast_on_refusals(
    monkeypatch: pytest.MonkeyPatch, outcomes: list[Outcome], message: str
) -> None:
    script = ScriptedS3(monkeypatch, outcomes)
    started = time.monotonic()
    with pytest.raises(StorageError, match=message) as caught:
        probe(_s3_location())
    assert time.monotonic() - started < 1
    assert script.outcomes == [] and len(script.requests) == len(outcomes)  # no retry
    assert "s3://bucket/prefix" in str(caught.value)
    if "credentials" in message or "Invalid" in message or "Signature" in message:
        assert "AWS_ACCESS_KEY_ID" in str(caught.value)


def test_probe_gives_up_on_persistent_transient_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.exceptions import EndpointConnectionError

    endpoint = "http://127.0.0.1:9"
    script = ScriptedS3(monkeypatch, [EndpointConnectionError(endpoint_url=endpoint)] * 50)
    started = time.monotonic()
    with pytest.raises(StorageError, match="cannot reach object storage") as caught:
        probe(_s3_location(endpoint), retry_seconds=1.0)
    assert time.monotonic() - started < 3
    assert len(script.requests) > 1
    assert endpoint in str(caught.value) and "AWS_ENDPOINT_URL" in str(caught.value)


def test_probe_names_a_server_that_keeps_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    ScriptedS3(monkeypatch, [_s3_error("SlowDown", 503)] * 50)
    with pytest.raises(StorageError, match="kept failing.*SlowDown.*check the server"):
        probe(_s3_location(), retry_seconds=0.5)


class _NoResponse(Exception):
    response = None  # some clients set it, but to None


def test_probe_explains_errors_without_a_response(monkeypatch: pytest.MonkeyPatch) -> None:
    ScriptedS3(monkeypatch, [_NoResponse("gone")])
    with pytest.raises(StorageError, match=r"cannot reach object storage.*_NoResponse: gone"):
        probe(_s3_location())


def test_error_codes_and_transience() -> None:
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        EndpointConnectionError,
        ReadTimeoutError,
        SSLError,
    )

    for error in (
        EndpointConnectionError(endpoint_url="http://x"),
        ReadTimeoutError(endpoint_url="http://x"),
        ClientError({"Error": {"Code": "InternalError"}}, "HeadBucket"),
        ClientError({"Error": {"Code": "503"}}, "HeadBucket"),
        ClientError({"ResponseMetadata": {"HTTPStatusCode": 500}}, "HeadBucket"),
    ):
        assert PROBE.is_transient(error), error
    slow = ClientError({"Error": {"Code": "SlowDown"}}, "PutObject")
    status_only = ClientError({"ResponseMetadata": {"HTTPStatusCode": 502}}, "HeadBucket")
    denied = ClientError({"Error": {"Code": "AccessDenied"}}, "PutObject")
    assert [PROBE.error_code(e) for e in (slow, status_only, denied)] == [
        "SlowDown",
        "502",
        "AccessDenied",
    ]
    closed = ConnectionClosedError(endpoint_url="http://x")
    assert PROBE.error_code(closed) == "" and PROBE.error_code(_NoResponse()) == ""
    assert PROBE.is_transient(slow) and PROBE.is_transient(status_only)
    assert PROBE.is_transient(closed) and PROBE.is_transient(ConnectionResetError())
    assert not PROBE.is_transient(denied)
    assert not PROBE.is_transient(SSLError(endpoint_url="https://x", error="bad cert"))
    assert not PROBE.is_transient(ValueError("x"))


def test_probe_of_a_server_that_closes_every_connection_ends_within_seconds() -> None:
    """A real socket that accepts and closes without answering: retried, then refused."""
    accepted = []
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(1)
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    started = time.monotonic()
    try:
        with pytest.raises(StorageError, match="cannot reach object storage") as caught:
            probe(_s3_location(endpoint))
    finally:
        stop.set()
        thread.join()
        server.close()
    elapsed = time.monotonic() - started
    assert 2 < elapsed < 10, elapsed  # retried for a few seconds, never for long
    assert len(accepted) > 1
    assert endpoint in str(caught.value)


def test_local_compare_and_swap_counts_exactly_with_one_lock_file_per_folder(
    tmp_path: Path,
) -> None:
    """Each thread opens the lock itself, as another process would: flock serializes them."""
    from concurrent.futures import ThreadPoolExecutor

    store = LocalStore(tmp_path)

    def add_one(_: int) -> None:
        while True:
            value, tag = store.read_versioned("c/counter.json")
            count = 0 if value is None else value["n"]
            if store.write_if("c/counter.json", {"n": count + 1}, tag) is not None:
                return

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(add_one, range(200)))
    assert store.read_json("c/counter.json") == {"n": 200}
    for seq in range(30):  # an object per checkpoint, each swapped and deleted
        tag = store.write_if(f"c/{seq:02d}.json", {"seq": seq}, None)
        assert tag is not None and store.delete_if(f"c/{seq:02d}.json", tag)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        ".streamkeeper.lock",
        "counter.json",
    ]
    assert store.list("c") == ["c/counter.json"]


@pytest.mark.parametrize("key", ["../outside.json", "jobs/../../etc/passwd", "/etc/passwd"])
def test_a_local_key_never_reaches_outside_the_root(tmp_path: Path, key: str) -> None:
    store = LocalStore(tmp_path / "root")
    for touch in (
        lambda: store.read_json(key),
        lambda: store.write_json(key, {"x": 1}),
        lambda: store.list(key),
        lambda: store.delete([key]),
    ):
        with pytest.raises(StorageError, match="escapes the store's root"):
            touch()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
