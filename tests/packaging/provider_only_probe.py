"""Run by the provider-only venv's interpreter (no pyspark, deltalake, pandas,
great_expectations): imports every provider module, parses the repository's DAGs, runs a
trigger to its event, loads the plugin and serves the operations page's routes. Prints
one JSON line with what it saw; test_provider_only.py compares it with the full install.

Usage: python provider_only_probe.py REPO ROOT JOB
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import pkgutil
import sys
from pathlib import Path

HEAVY = ("pyspark", "py4j", "deltalake", "pandas", "great_expectations")


def _import_every_module() -> dict[str, str]:
    import streamkeeper_airflow

    failed = {}
    for module in pkgutil.walk_packages(streamkeeper_airflow.__path__, "streamkeeper_airflow."):
        try:
            importlib.import_module(module.name)
        except Exception as error:  # reported, compared with nothing: must stay empty
            failed[module.name] = f"{type(error).__name__}: {error}"
    return failed


def _parse_dags(repo: Path) -> dict[str, object]:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(repo / "dags"))
    return {"dag_ids": sorted(bag.dag_ids), "errors": {k: v for k, v in bag.import_errors.items()}}


def _run_trigger(root: str, job: str) -> dict[str, object]:
    from streamkeeper_airflow.triggers.checkpoints import CheckpointProgressTrigger

    trigger = CheckpointProgressTrigger(
        conn_id="streamkeeper_default",
        job=job,
        baseline_seq=30,
        new_checkpoints=2,
        poll_interval=0.1,
    )

    async def first_event() -> dict[str, object]:
        events = trigger.run()
        try:
            event = await asyncio.wait_for(anext(events), timeout=60)
        finally:
            await events.aclose()
        return event.payload

    return asyncio.run(first_event())


def _serve_page(root: str, job: str) -> dict[str, object]:
    from airflow import plugins_manager
    from fastapi.testclient import TestClient

    from streamkeeper.client import StreamkeeperClient
    from streamkeeper_airflow.ui.app import create_app

    plugins, errors = plugins_manager._get_plugins()
    ours = [p for p in plugins if p.name == "streamkeeper"]
    http = TestClient(
        create_app(
            client_factory=lambda: StreamkeeperClient(root),
            spec_jobs=lambda: {},
            authenticate=False,
        )
    )
    page = http.get("/")
    return {
        "plugins": [p.name for p in plugins],
        "plugin_errors": errors,
        "plugin_apps": [app["url_prefix"] for p in ours for app in p.fastapi_apps],
        "page_status": page.status_code,
        "page_has_title": "Streaming jobs" in page.text,
        "jobs": http.get("/api/jobs").json(),
        "job": http.get(f"/api/jobs/{job}").json(),
    }


def main() -> None:
    repo, root, job = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    seen = {
        "import_failures": _import_every_module(),
        "dags": _parse_dags(repo),
        "trigger_event": _run_trigger(root, job),
        "page": _serve_page(root, job),
        # After all of the above: nothing heavy was installed, let alone imported.
        "heavy_installed": [m for m in HEAVY if importlib.util.find_spec(m) is not None],
        "heavy_imported": [m for m in HEAVY if m in sys.modules],
    }
    print(json.dumps(seen, default=str))


if __name__ == "__main__":
    main()
