"""The operations page's FastAPI app, mounted by the plugin at `/streamkeeper`.

    GET  /                                 the page (HTML; page.js and page.css beside it,
                                           the chart library in static/vendor/)
    GET  /api/jobs?q=&offset=&limit=       one page of job summaries (small files only)
    GET  /api/jobs/{job}?window=200        the open job: charts, savepoints, upgrades, specs
    GET  /api/jobs/{job}/runs              its lifecycle DAGs' newest runs (Airflow's API)
    GET  /api/jobs/{job}/driver-log        the tail of its driver's log (text; driver_log.py)
    POST /api/jobs/{job}/actions/{action}  trigger savepoint|stop|restart|upgrade|rollback
    GET  /api/dag-runs/{dag_id}/{run_id}   one DAG run's state (Airflow's API)

Every route sits behind Airflow's own authentication (its `get_user`: the
JWT in the Authorization header or Airflow's `_token` cookie), so an anonymous request
gets 401. A job is shown only to users who may read its DAGs (`access`); to others it
is a 404, like a job that does not exist. An action also needs the right to trigger its
DAG, and goes to Airflow's REST API at a configured or loopback address (never the
request's `Host`) with the caller's token, so Airflow checks and audits it again. Text
read from storage is redacted (`secrets.redact`) before it reaches the browser, and
every response carries a strict Content-Security-Policy (`SECURITY_HEADERS`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Body, Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse

from streamkeeper_airflow.secrets import redact_value
from streamkeeper_airflow.ui import actions, details, driver_log, summaries
from streamkeeper_airflow.ui.access import AirflowUserAccess, Everyone, JobAccess, job_of_dag
from streamkeeper_airflow.ui.airflow_api import AirflowApi, configured_api_url, user_token

if TYPE_CHECKING:
    from streamkeeper.client import StreamkeeperClient

STATIC = Path(__file__).parent / "static"
VENDOR = STATIC / "vendor"  # the chart library, copied from npm by infra/vendor_ui.sh
PAGE_HEADER = "x-streamkeeper-page"  # set by page.js: a cross-site form cannot set it
NOTE = "triggered from the streamkeeper operations page"
# The page loads only its own files and talks only to its own routes. Airflow's UI shows
# it in an iframe at /plugin/streamkeeper, served by the same api-server: so 'self' may
# frame it and no other site may (clickjacking the action buttons).
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'self'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "SAMEORIGIN",  # frame-ancestors for browsers without CSP level 2
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


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


def _configured_workdir() -> str:
    from streamkeeper_airflow import settings

    return settings.workdir()


def _authenticated() -> list[Any]:
    """Airflow's own login check (`get_user`: 401 without a valid JWT), keeping the user's
    `JobAccess` for the routes."""
    from airflow.api_fastapi.core_api.security import get_user

    def remember_access(request: Request, user: Any = Depends(get_user)) -> None:  # noqa: B008
        request.state.streamkeeper_access = AirflowUserAccess(user)

    return [Depends(remember_access)]


def job_access(request: Request) -> JobAccess:
    """The request's user's `JobAccess` (everyone's only if the app does not authenticate)."""
    access = getattr(request.state, "streamkeeper_access", None)
    if access is not None:
        return access
    if request.app.state.authenticate:  # fail closed, whatever order dependencies ran in
        raise HTTPException(401, "Not authenticated")
    return Everyone()


Access = Annotated[JobAccess, Depends(job_access)]


def _airflow(request: Request) -> AirflowApi:
    token = user_token(request.headers.get("authorization"), dict(request.cookies))
    if token is None:  # unreachable behind get_user; kept for authenticate=False
        raise HTTPException(401, "Not authenticated")
    return AirflowApi(configured_api_url(), token)


def _reply(reply: Any) -> JSONResponse:
    return JSONResponse(reply.body, status_code=reply.status)


class JobSource:
    """The control plane and the jobs folder, each re-read at most every few seconds."""

    def __init__(
        self,
        client_factory: Callable[[], StreamkeeperClient],
        spec_jobs: Callable[[], dict[str, list[str]]],
        secrets: Callable[[], Iterable[str | None]],
        client_ttl: float,
        drivers_workdir: Callable[[], str] | None = None,
    ) -> None:
        self.drivers_workdir = drivers_workdir or _configured_workdir
        self._client = TtlCache(client_factory, client_ttl)
        self._specs = TtlCache(spec_jobs, 30.0)
        self._secrets = TtlCache(lambda: tuple(secrets()), client_ttl)

    @property
    def client(self) -> StreamkeeperClient:
        return self._client.get()

    def specs(self) -> dict[str, list[str]]:
        return self._specs.get()

    def redacted(self, value: Any) -> Any:
        """`value` (JSON-like) with the connection's secrets and credential-like text masked."""
        return redact_value(value, self._secrets.get())

    def names(self, access: JobAccess) -> tuple[list[str], set[str]]:
        """Every job the user may see (ran below the root, or defined by a spec), and
        those that ran."""
        started = set(self.client.jobs())
        return access.readable(sorted(started | set(self.specs()))), started

    def visible(self, job: str, access: JobAccess) -> None:
        """Raises a 404 for a job that does not exist or that the user may not see: the
        same answer, so a job's existence is not leaked."""
        if job not in self.names(access)[0]:
            raise HTTPException(404, f"no job {job!r}")


def create_app(
    *,
    client_factory: Callable[[], StreamkeeperClient],
    spec_jobs: Callable[[], dict[str, list[str]]] = dict,
    secrets: Callable[[], Iterable[str | None]] = tuple,
    authenticate: bool = True,
    client_ttl: float = 60.0,
    drivers_workdir: Callable[[], str] | None = None,
) -> FastAPI:
    """The app.

    Args:
        client_factory: builds the control-plane client (the plugin: from the Airflow
            connection `streamkeeper_default`); rebuilt every `client_ttl` seconds.
        spec_jobs: job name -> spec files a version of it may be upgraded to, for the
            jobs defined in the jobs folder (shown even before their first start).
        secrets: the connection's credentials, masked in every text the page shows.
        authenticate: False only for tests and the benchmark's in-process client (then
            every job is visible and every action allowed).
        drivers_workdir: the drivers' working directory, whose log folder is the only
            place a driver log is read from (default: `[streamkeeper] workdir`).
    """
    app = FastAPI(
        title="streamkeeper operations",
        dependencies=_authenticated() if authenticate else [],
        docs_url=None,
        redoc_url=None,
    )

    source = JobSource(client_factory, spec_jobs, secrets, client_ttl, drivers_workdir)

    @app.exception_handler(ValueError)
    def bad_value(_: Request, error: ValueError) -> JSONResponse:
        return JSONResponse({"detail": source.redacted(str(error))}, status_code=400)

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    app.state.authenticate = authenticate
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

    vendored = {p.name for p in VENDOR.iterdir() if p.suffix in (".js", ".css")}

    @app.get("/static/vendor/{name}", include_in_schema=False)
    def vendor(name: str) -> FileResponse:
        if name not in vendored:
            raise HTTPException(404, f"no file {name!r}")
        return FileResponse(VENDOR / name)


def _job_routes(app: FastAPI, source: JobSource) -> None:
    @app.get("/api/jobs")
    def jobs(access: Access, q: str = "", offset: int = 0, limit: int = 20) -> dict[str, Any]:
        names, started = source.names(access)
        page = summaries.job_page(
            source.client, names=names, started=started, query=q, offset=offset, limit=limit
        )
        return source.redacted(page.to_json())

    @app.get("/api/jobs/{job}/driver-log", response_class=PlainTextResponse)
    def driver_log_tail(job: str, access: Access) -> PlainTextResponse:
        source.visible(job, access)
        folder = driver_log.logs_folder(source.drivers_workdir())
        log = driver_log.read_driver_log(source.client.store, job, folder)
        header = source.redacted(f"# {job}: {log.message}\n")
        if log.text is None:
            return PlainTextResponse(header, status_code=404)
        return PlainTextResponse(header + source.redacted(log.text))

    @app.get("/api/jobs/{job}")
    def job(job: str, access: Access, window: int = 200) -> dict[str, Any]:
        client, (names, ran) = source.client, source.names(access)
        if job not in names:
            raise HTTPException(404, f"no job {job!r}; jobs: {', '.join(names)}")
        page = summaries.job_page(client, names=[job], started=ran)
        started = job in ran  # a spec's job that never ran has no control plane yet
        return source.redacted(
            {
                "summary": page.jobs[0].to_json(),
                "history": details.history_window(client, job, window) if started else None,
                "savepoints": details.savepoint_list(client, job) if started else [],
                "upgrades": details.recent_upgrades(client, job) if started else [],
                "upgrade_specs": source.specs().get(job, []),
                "windows": list(details.WINDOWS),
            }
        )


def _airflow_routes(app: FastAPI, source: JobSource) -> None:
    @app.get("/api/jobs/{job}/runs")
    def runs(job: str, request: Request, access: Access) -> JSONResponse:
        source.visible(job, access)
        return _reply(_airflow(request).recent_runs(actions.lifecycle_dag_ids(job)))

    @app.post("/api/jobs/{job}/actions/{action}")
    def act(
        job: str,
        action: str,
        request: Request,
        access: Access,
        options: Annotated[dict[str, Any], Body()],
    ) -> JSONResponse:
        if request.headers.get(PAGE_HEADER) != "1" and "authorization" not in request.headers:
            raise HTTPException(403, f"actions need the {PAGE_HEADER} header (sent by the page)")
        source.visible(job, access)
        run = actions.dag_run_for(job, action, options)
        if not access.may_trigger(run.dag_id):
            raise HTTPException(403, f"you may not trigger DAG {run.dag_id!r}")
        return _reply(_airflow(request).trigger(run.dag_id, run.conf, NOTE))

    @app.get("/api/dag-runs/{dag_id}/{run_id}")
    def dag_run(dag_id: str, run_id: str, request: Request, access: Access) -> JSONResponse:
        job = job_of_dag(dag_id)  # only a job's own DAGs, and only a job the user sees
        if job is None:
            raise HTTPException(404, f"no job DAG {dag_id!r}")
        source.visible(job, access)
        return _reply(_airflow(request).dag_run(dag_id, run_id))
