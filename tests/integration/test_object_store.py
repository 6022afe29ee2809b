"""The object store's contract on both backends: the local file system and a real S3 server.

Compare-and-swap (`write_if`, `delete_if`) is what keeps an older runner from overwriting
what a newer one wrote; `list(start_after=...)` and `children` keep listings bounded.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from streamkeeper.storage import Location, ObjectStore, S3Settings


@pytest.fixture(params=["local", pytest.param("s3", marks=[pytest.mark.s3])])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return Location(str(tmp_path / "root")).store()
    request.getfixturevalue("s3_env")
    root = f"s3://streamkeeper/objects-{uuid.uuid4().hex[:8]}"
    return Location(root, S3Settings.from_env()).store()


def test_write_if_is_compare_and_swap(store: ObjectStore) -> None:
    created = store.write_if("a/x.json", {"n": 1}, None)
    assert created is not None
    assert store.write_if("a/x.json", {"n": 2}, None) is None  # exists: create refused
    value, version = store.read_versioned("a/x.json")
    assert value == {"n": 1} and version == created
    updated = store.write_if("a/x.json", {"n": 2}, created)
    assert updated is not None and updated != created
    assert store.write_if("a/x.json", {"n": 3}, created) is None  # stale version refused
    assert store.read_json("a/x.json") == {"n": 2}
    assert store.delete_if("a/x.json", created) is False
    assert store.read_json("a/x.json") == {"n": 2}
    assert store.delete_if("a/x.json", updated) is True
    assert store.read_versioned("a/x.json") == (None, None)


def test_create_json_is_put_if_absent(store: ObjectStore) -> None:
    assert store.create_json("e/1.json", {"owner": "a"}) is True
    assert store.create_json("e/1.json", {"owner": "b"}) is False
    assert store.read_json("e/1.json") == {"owner": "a"}


def test_concurrent_compare_and_swap_loses_no_increment(store: ObjectStore) -> None:
    store.write_if("counter.json", {"n": 0}, None)

    def increment(times: int) -> None:
        done = 0
        while done < times:
            value, version = store.read_versioned("counter.json")
            assert value is not None
            # Values carry a unique token, as every control-plane record does: a writer
            # recognises its own write after a lost response by its exact bytes.
            new = {"n": value["n"] + 1, "token": uuid.uuid4().hex}
            if store.write_if("counter.json", new, version) is not None:
                done += 1

    threads = [threading.Thread(target=increment, args=(10,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.read_json("counter.json")["n"] == 40


def test_list_start_after_and_children(store: ObjectStore) -> None:
    for name in ("m/001.json", "m/002.json", "m/003.json", "m/sub/004.json", "n/x/1.json"):
        store.write_json(name, {})
    assert store.list("m") == ["m/001.json", "m/002.json", "m/003.json", "m/sub/004.json"]
    assert store.list("m", start_after="m/002.json") == ["m/003.json", "m/sub/004.json"]
    assert store.list("m", start_after="m/001") == store.list("m")
    assert store.children("") == ["m", "n"]
    assert store.children("n") == ["x"]
    assert store.children("m") == ["sub"]
    assert store.children("nothing-here") == []
