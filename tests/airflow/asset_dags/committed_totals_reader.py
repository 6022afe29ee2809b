"""A downstream DAG scheduled on a live table: keyed-totals' `totals`, as an Asset.

Each run reads the table as of the Delta version the triggering asset event names (the
job's stable commit) and returns what it read, for the scheduler test to check against
the input. Only the scheduler test puts this file in the DAGs folder (it needs the job's
spec and connection at parse time).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import dag, task

from streamkeeper_airflow.assets import committed_version, job_table_assets

TOTALS = job_table_assets("keyed-totals", poll_interval=2)["totals"]


@dag(dag_id="keyed-totals.committed-reader", schedule=[TOTALS], catchup=False)
def committed_totals_reader() -> None:
    @task(inlets=[TOTALS])
    def read(*, triggering_asset_events: Any = None) -> dict[str, Any]:
        from deltalake import DeltaTable

        event = triggering_asset_events[TOTALS][-1]
        version = committed_version(event, "totals")
        payload = event.extra["payload"]
        table = DeltaTable(payload["tables"]["totals"], version=version)
        rows = table.to_pyarrow_table(columns=["key", "events", "total"]).to_pylist()
        return {
            "seq": payload["seq"],
            "batch_id": payload["batch_id"],
            "version": version,
            "events": len(triggering_asset_events[TOTALS]),
            "rows": sorted(rows, key=lambda row: row["key"]),
        }

    read()


committed_totals_reader()
