"""Storage URIs, path confinement, the local object store and S3 settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamkeeper.errors import StorageError
from streamkeeper.spec import StorageSpec
from streamkeeper.storage import LocalStore, Location, S3Settings, join_under, probe, resolve_root


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
    (tmp_path / "m" / ".hidden.tmp").write_text("{}")
    assert store.list("m") == ["m/02.json", "m/10.json", "m/sub/01.json"]
    assert store.list("missing") == []


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


def test_probe_local_unwritable_names_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="cannot write to") as caught:
        probe(Location(str(blocker)))
    assert str(blocker) in str(caught.value)
