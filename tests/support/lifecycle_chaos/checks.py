"""The end checks of a lifecycle chaos run: each table of `keyed-totals` exactly against a
reference computed from the input files, and what differs, by how much, from which file.

- `totals` (merge): per key, (events, total) of every input file; a key off by some
  events names the surplus (a doubled batch) or the shortfall (a lost one).
- `changes` (append, a changelog): the cut-aware check of tests/support/fault_checks.py
  (each pre-committed seq folder is the changelog of the next run of input files, once),
  and the multiset of rows against the changelog of one batch per file (the job reads one
  file a batch); each row missing or doubled is traced to the input file that made it.
- `means` (merge, v2 only, when green was promoted): each row is its key's final
  total / events.

Never the tables' own markers: a lost or doubled batch must show against the input.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jobs.keyed_totals.sample_events import expected_results, read_events
from streamkeeper.storage import Location

Change = tuple[str, int, int]


@dataclass
class TableCheck:
    """One table against its reference."""

    table: str
    exact: bool
    rows: int
    expected_rows: int
    missing: int = 0  # reference rows (or keys) the table lacks, or holds short
    extra: int = 0  # rows (or keys) beyond the reference: doubled, or from no input
    detail: list[str] = field(default_factory=list)
    # Not exact: the first this many input files are exactly what the table holds (the
    # job stopped there, nothing lost or doubled before); None: no prefix of the input is.
    prefix_files: int | None = None
    input_files: int = 0

    def summary(self) -> str:
        if self.exact:
            return f"{self.table}: exact ({self.rows} rows)"
        if self.prefix_files is not None:
            return (
                f"{self.table}: exactly the first {self.prefix_files} of {self.input_files} "
                "input files (nothing lost or doubled; the rest never processed)"
            )
        return (
            f"{self.table}: {self.missing} missing, {self.extra} extra of {self.expected_rows} "
            f"expected ({self.rows} found): {'; '.join(self.detail[:4])}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _rows(table: Path) -> list[dict[str, Any]]:
    from tests.support.fault_checks import _rows as fragment_rows

    return fragment_rows(Location(str(table)))


def _prefix(files: list[Path], matches: Any) -> int | None:
    """The largest n such that `matches(expected_results(files[:n]))`, or None."""
    for n in range(len(files), -1, -1):
        if matches(*expected_results(files[:n])):
            return n
    return None


def check_totals(table: Path, files: list[Path]) -> TableCheck:
    expected, _ = expected_results(files)
    found = {r["key"]: (r["events"], r["total"]) for r in _rows(table)}
    check = TableCheck("totals", found == expected, len(found), len(expected))
    surplus = shortfall = 0
    for key in sorted(set(expected) | set(found)):
        want, got = expected.get(key, (0, 0)), found.get(key, (0, 0))
        if want == got:
            continue
        surplus += max(0, got[0] - want[0])
        shortfall += max(0, want[0] - got[0])
        check.missing += int(got[0] < want[0] or key not in found)
        check.extra += int(got[0] > want[0] or key not in expected)
        if len(check.detail) < 3:
            check.detail.append(f"totals[{key}] = {found.get(key)}, expected {expected.get(key)}")
    if not check.exact:
        check.detail.insert(
            0,
            f"{check.missing + check.extra} keys differ: {surplus} events too many (doubled), "
            f"{shortfall} too few (lost)",
        )
        check.prefix_files = _prefix(files, lambda totals, _: totals == found)
    check.input_files = len(files)
    return check


def _file_of_change(files: list[Path]) -> dict[tuple[str, int], int]:
    """(key, events so far) -> the index of the input file whose batch wrote that row."""
    counts: Counter[str] = Counter()
    origin = {}
    for index, path in enumerate(files):
        for event in read_events(path):
            counts[event["key"]] += 1
        touched = {e["key"] for e in read_events(path)}
        origin.update({(key, counts[key]): index for key in touched})
    return origin


def _spans(indexes: list[int]) -> str:
    """1,2,3,7 -> '1..3, 7'."""
    spans: list[str] = []
    for index in sorted(set(indexes)):
        if spans and spans[-1].split("..")[-1] == str(index - 1):
            spans[-1] = f"{spans[-1].split('..')[0]}..{index}"
        else:
            spans.append(str(index))
    return ", ".join(spans)


def check_changes(table: Path, files: list[Path]) -> TableCheck:
    from tests.support.fault_checks import check_keyed

    _, expected = expected_results(files)
    rows = [(r["key"], r["events"], r["total"]) for r in _rows(table)]
    want, got = Counter(expected), Counter(rows)
    missing, extra = want - got, got - want
    check = TableCheck("changes", not missing and not extra, len(rows), len(expected))
    check.missing, check.extra = sum(missing.values()), sum(extra.values())
    origin = _file_of_change(files)
    if missing:
        lost = [origin[(k, e)] for k, e, _ in missing.elements()]
        check.detail.append(f"rows of input files {_spans(lost)} missing")
    doubled = [origin[(k, e)] for k, e, t in extra.elements() if (k, e, t) in want]
    if doubled:
        check.detail.append(f"rows of input files {_spans(doubled)} more than once")
    strays = [row for row in extra.elements() if row not in want]
    if strays:
        check.detail.append(f"{len(strays)} rows of no input file, e.g. {strays[:2]}")
    # The cut-aware check: each seq's files are the changelog of the next run of files.
    cut = check_keyed(Location(str(table.parent / "totals")), Location(str(table)), files)
    structural = [p for p in cut.problems if p.startswith("changes")]
    if structural:
        check.exact = False
        check.detail += structural[:3]
    if not check.exact:
        check.prefix_files = _prefix(files, lambda _, changes: Counter(changes) == got)
    check.input_files = len(files)
    return check


def check_means(table: Path, files: list[Path]) -> TableCheck:
    """Each `means` row is its key's final total / events (green writes it from its live
    run on: keys it never touched are absent, not wrong)."""
    totals, _ = expected_results(files)
    rows = _rows(table)
    check = TableCheck("means", True, len(rows), len(rows))
    for row in rows:
        events, total = totals.get(row["key"], (0, 0))
        want = None if not events else total / events
        if want is None or abs(float(row["mean"]) - want) > 1e-9 * max(1.0, abs(want)):
            check.exact = False
            check.extra += 1
            if len(check.detail) < 3:
                check.detail.append(f"means[{row['key']}] = {row['mean']}, expected {want}")
    return check


def check_tables(root: Path, files: list[Path], *, promoted: bool) -> list[TableCheck]:
    """Every live table of the job against the input (`means` only if v2 won)."""
    tables = root / "tables"
    checks = [check_totals(tables / "totals", files), check_changes(tables / "changes", files)]
    if promoted and (tables / "means" / "_delta_log").is_dir():
        checks.append(check_means(tables / "means", files))
    return checks


def audit_and_leftovers(root: Path, checkpoint: Path) -> tuple[int, list[str], dict[str, list]]:
    """(tables audited, audit problems, orphans by kind) below the root."""
    from tests.support.delta_audit import audit_table
    from tests.support.fault_checks import AWAITING_SWEEP, find_orphans

    location = Location(str(root))
    found = sorted({log.parent.parent for log in root.rglob("_delta_log/*.json")})
    tables = [Location(str(path)) for path in found]
    problems = [f"{t.uri}: {p}" for t in tables for p in audit_table(t)]
    orphans = find_orphans(location, tables, [checkpoint])
    orphans.pop(AWAITING_SWEEP, None)  # a sweep's business, not a leftover (fault_checks)
    return len(tables), problems, {k: v for k, v in orphans.items() if v}
