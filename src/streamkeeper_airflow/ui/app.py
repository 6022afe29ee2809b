"""The operations page's FastAPI app, mounted by the plugin at `/streamkeeper`.

    GET  /                                 the page (HTML; page.js and page.css beside it)
    GET  /api/jobs?q=&offset=&limit=       one page of job summaries (small files only)
    GET  /api/jobs/{job}?window=200        the open job: charts, savepoints, upgrades, specs
    GET  /api/jobs/{job}/runs              its lifecycle DAGs' newest runs (Airflow's API)
    POST /api/jobs/{job}/actions/{action}  trigger savepoint|stop|restart|upgrade|rollback
    GET  /api/dag-runs/{dag_id}/{run_id}   one DAG run's state (Airflow's API)

Every route sits behind Airflow's own authentication (`requires_authenticated`: the
JWT in the Authorization header or Airflow's `_token` cookie), so an anonymous request
gets 401. Actions and runs go to Airflow's REST API with the caller's token: a user
without the right to trigger a DAG gets Airflow's 403, passed on as it came.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Body, Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse

from streamkeeper_airflow.ui import actions, details, summaries
from streamkeeper_airflow.ui.airflow_api import AirflowApi, user_token

if TYPE_CHECKING:
    from streamkeeper.client import StreamkeeperClient

STATIC = Path(__file__).parent / "static"
PAGE_HEADER = "x-streamkeeper-page"  # set by page.js: a cross-site form cannot set it
NOTE = "triggered from the streamkeeper operations page"


class TtlCache:
    """A value recomputed at most every `ttl` seconds (connection, spec folder)."""

    def __init__(self, make: Callable[[], Any], ttl: float) -> None:
        self.make, self.ttl = make, ttl
        self._value: Any = None
        self._at = float("-inf")

    def get(self) -> Any:
        if time.monotonic() - self._at > self.ttl:
            self._value, self._at = self.make(), time.monotonic()
        return self._value


def _authenticated() -> list[Any]:
    from airflow.api_fastapi.core_api.security import requires_authenticated

    return [Depends(requires_authenticated())]


def _airflow_url(request: Request) -> str:
    """`[streamkeeper] airflow_api_url`, else this request's origin (the same api-server)."""
    from streamkeeper_airflow.settings import option

    return option("airflow_api_url") or f"{request.url.scheme}://{request.url.netloc}"


def _airflow(request: Request) -> AirflowApi:
    token = user_token(request.headers.get("authorization"), dict(request.cookies))
    if token is None:  # unreachable behind requires_authenticated; kept for authenticate=False
        raise HTTPException(401, "Not authenticated")
    return AirflowApi(_airflow_url(request), token)


def _reply(reply: Any) -> JSONResponse:
    return JSONResponse(reply.body, status_code=reply.status)


class JobSource:
    """The control plane and the jobs folder, each re-read at most every few seconds."""

    def __init__(
        self,
        client_factory: Callable[[], StreamkeeperClient],
        spec_jobs: Callable[[], dict[str, list[str]]],
        client_ttl: float,
    ) -> None:
        self._client = TtlCache(client_factory, client_ttl)
        self._specs = TtlCache(spec_jobs, 30.0)

    @property
    def client(self) -> StreamkeeperClient:
        return self._client.get()

    def specs(self) -> dict[str, list[str]]:
        return self._specs.get()

    def names(self) -> tuple[list[str], set[str]]:
        """Every job (ran below the root, or defined by a spec) and those that ran."""
        started = set(self.client.jobs())
        return sorted(started | set(self.specs())), started


def create_app(
    *,
    client_factory: Callable[[], StreamkeeperClient],
    spec_jobs: Callable[[], dict[str, list[str]]] = dict,
    authenticate: bool = True,
    client_ttl: float = 60.0,
) -> FastAPI:
    """The app.

    Args:
        client_factory: builds the control-plane client (the plugin: from the Airflow
            connection `streamkeeper_default`); rebuilt every `client_ttl` seconds.
        spec_jobs: job name -> spec files a version of it may be upgraded to, for the
            jobs defined in the jobs folder (shown even before their first start).
        authenticate: False only for tests and the benchmark's in-process client.
    """
    app = FastAPI(
        title="streamkeeper operations",
        dependencies=_authenticated() if authenticate else [],
        docs_url=None,
        redoc_url=None,
    )

    @app.exception_handler(ValueError)
    def bad_value(_: Request, error: ValueError) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=400)

    source = JobSource(client_factory, spec_jobs, client_ttl)
    _page_routes(app)
    _job_routes(app, source)
    _airflow_routes(app, source)
    return app


def _page_routes(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> FileResponse:
        if name not in ("page.js", "page.css"):
            raise HTTPException(404, f"no file {name!r}")
        return FileResponse(STATIC / name)


def _job_routes(app: FastAPI, source: JobSource) -> None:
    @app.get("/api/jobs")
    def jobs(q: str = "", offset: int = 0, limit: int = 20) -> dict[str, Any]:
        names, started = source.names()
        page = summaries.job_page(
            source.client, names=names, started=started, query=q, offset=offset, limit=limit
        )
        return page.to_json()

    @app.get("/api/jobs/{job}")
    def job(job: str, window: int = 200) -> dict[str, Any]:
        client, (names, ran) = source.client, source.names()
        if job not in names:
            raise HTTPException(404, f"no job {job!r}; jobs: {', '.join(names)}")
        page = summaries.job_page(client, names=[job], started=ran)
        started = job in ran  # a spec's job that never ran has no control plane yet
        return {
            "summary": page.jobs[0].to_json(),
            "history": details.history_window(client, job, window) if started else None,
            "savepoints": details.savepoint_list(client, job) if started else [],
            "upgrades": details.recent_upgrades(client, job) if started else [],
            "upgrade_specs": source.specs().get(job, []),
            "windows": list(details.WINDOWS),
        }


def _airflow_routes(app: FastAPI, source: JobSource) -> None:
    @app.get("/api/jobs/{job}/runs")
    def runs(job: str, request: Request) -> JSONResponse:
        return _reply(_airflow(request).recent_runs(actions.lifecycle_dag_ids(job)))

    @app.post("/api/jobs/{job}/actions/{action}")
    def act(
        job: str, action: str, request: Request, options: Annotated[dict[str, Any], Body()]
    ) -> JSONResponse:
        if request.headers.get(PAGE_HEADER) != "1" and "authorization" not in request.headers:
            raise HTTPException(403, f"actions need the {PAGE_HEADER} header (sent by the page)")
        if job not in source.names()[0]:
            raise HTTPException(404, f"no job {job!r}")
        run = actions.dag_run_for(job, action, options)
        return _reply(_airflow(request).trigger(run.dag_id, run.conf, NOTE))

    @app.get("/api/dag-runs/{dag_id}/{run_id}")
    def dag_run(dag_id: str, run_id: str, request: Request) -> JSONResponse:
        return _reply(_airflow(request).dag_run(dag_id, run_id))
