"""Commit marker retention (lineage/markers.py): what is retired and what stays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamkeeper.errors import FencedError
from streamkeeper.lineage.layout import LineageLayout, seq_of
from streamkeeper.lineage.markers import latest_marker, marker_seqs_after, retire_markers
from streamkeeper.storage import LocalStore, Location

T0 = 1_700_000_000.0  # in the past: a call without `now` finds them all old


@pytest.fixture
def lineage(tmp_path: Path) -> tuple[LocalStore, LineageLayout]:
    """300 markers, one a second: seq n committed at T0 + n."""
    store = LocalStore(tmp_path)
    layout = LineageLayout(Location(str(tmp_path)), "lin", "job")
    for seq in range(300):
        marker = {"seq": seq, "versions": {"totals": seq + 1}, "committed_at": T0 + seq}
        path = tmp_path / layout.marker(seq)  # as the store writes it, without an fsync each
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(marker))
    return store, layout


def _seqs(store: LocalStore, layout: LineageLayout) -> list[int]:
    return [seq_of(k) for k in store.list(layout.markers)]


def test_old_unprotected_markers_beyond_the_newest_are_retired(
    lineage: tuple[LocalStore, LineageLayout],
) -> None:
    store, layout = lineage
    # Markers older than 120 s at T0 + 300: seqs up to 179.
    retired = retire_markers(
        store,
        layout,
        head_seq=299,
        protected={5, 150, 250},
        history_retention=120.5,
        keep_last=100,
        now=T0 + 300,
    )
    assert retired == [s for s in range(180) if s not in (5, 150)]
    assert _seqs(store, layout) == [5, 150, *range(180, 300)]
    assert latest_marker(store, layout)["seq"] == 299  # type: ignore[index]
    assert latest_marker(store, layout, near=305)["seq"] == 299  # type: ignore[index]
    assert marker_seqs_after(store, layout, 100) == [150, *range(180, 300)]

    # Later, every one is old: the newest 100 stay whatever their age.
    again = retire_markers(
        store, layout, head_seq=299, protected={5}, history_retention=0, keep_last=100
    )
    assert again == [150, *range(180, 200)]
    assert _seqs(store, layout) == [5, *range(200, 300)]


def test_markers_younger_than_the_history_retention_stay(
    lineage: tuple[LocalStore, LineageLayout],
) -> None:
    store, layout = lineage
    retired = retire_markers(
        store, layout, head_seq=299, protected=set(), history_retention=3600, now=T0 + 300
    )
    assert retired == [] and len(_seqs(store, layout)) == 300


def test_a_fenced_runner_retires_nothing(lineage: tuple[LocalStore, LineageLayout]) -> None:
    store, layout = lineage

    def fenced() -> None:
        raise FencedError("epoch 1 is fenced by epoch 2")

    with pytest.raises(FencedError):
        retire_markers(
            store,
            layout,
            head_seq=299,
            protected=set(),
            history_retention=0,
            keep_last=100,
            guard=fenced,
        )
    assert len(_seqs(store, layout)) == 300
