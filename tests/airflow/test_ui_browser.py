"""The operations page in a real browser, inside a real Airflow, over a real running job.

Airflow's api-server (with the streamkeeper plugin and SimpleAuthManager users `admin`
and `viewer`), scheduler, dag-processor and triggerer run on 127.0.0.1; the sample job
is started by its start DAG (a real Spark driver). Headless Chromium (Debian's, through
Selenium) logs in on Airflow's login form, opens the page from Airflow's nav route, sees
the running job with a non-empty chart, triggers a savepoint from the page, confirms it,
follows the DAG run to success and sees the savepoint in the list. Around it: an
anonymous request is refused (401), and a viewer, who may read but not trigger DAGs,
gets a 403 for every action of the page (Airflow's auth manager decides, and the page
has no credential of its own: it forwards the user's token), and no DAG run or file
results. The page runs under its Content-Security-Policy throughout. Screenshots go to
`.streamkeeper/screenshots/` (gitignored) and are named in the output.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.components.airflow import AirflowServices, start_airflow
from jobs.keyed_totals.sample_events import write_event_files
from streamkeeper.client import StreamkeeperClient
from streamkeeper_airflow.ui.actions import lifecycle_dag_ids
from tests.support import browser
from tests.support.airflow_runs import stop_job_drivers

pytestmark = [
    pytest.mark.integration,
    pytest.mark.airflow,
    pytest.mark.browser,
    pytest.mark.timeout(900),
]

JOB = "keyed-totals"
REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / ".streamkeeper" / "screenshots"
PASSWORDS = {"admin": "admin-pw-1", "viewer": "viewer-pw-1"}


@pytest.fixture
def airflow(
    tmp_path: Path, conn_env: Any, monkeypatch: pytest.MonkeyPatch, airflow_db: float
) -> Iterator[tuple[AirflowServices, Path]]:
    if reason := browser.missing():
        pytest.fail(reason)
    root = tmp_path / "data"
    root.mkdir()
    write_event_files(tmp_path / "events", files=3, events_per_file=200)
    conn_env("streamkeeper_default", str(root))
    jobs = tmp_path / "jobs"  # the sample job without its schedules
    shutil.copytree(REPO / "jobs" / "keyed_totals", jobs / "keyed_totals")
    spec = jobs / "keyed_totals" / "job.yaml"
    text = re.sub(r"(monitor|savepoint)_schedule: .*", r"\1_schedule: null", spec.read_text())
    spec.write_text(text)
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__JOBS_FOLDER", str(jobs))
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__TRIGGER_OVERRIDES", "source.path, checkpoint.dir")
    monkeypatch.setenv("STREAMKEEPER_SPARK_LOG_LEVEL", "ERROR")
    auth = {
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
    }
    services = start_airflow(tmp_path / "airflow", auth)
    try:
        yield services, tmp_path
    finally:
        services.stop()
        stop_job_drivers(root, JOB)


# Every action of the page, with the options its form sends.
ACTIONS = {
    "savepoint": {"format": "native"},
    "stop": {"format": "native"},
    "restart": {},
    "upgrade": {"green_spec_path": str(REPO / "jobs" / "keyed_totals" / "versions" / "v2.yaml")},
    "rollback": {"savepoint_id": "sp-any"},
}


def _dag_run_ids(api: httpx.Client) -> dict[str, list[str]]:
    found = {}
    for dag_id in lifecycle_dag_ids(JOB):
        reply = api.get(f"/api/v2/dags/{dag_id}/dagRuns")
        assert reply.status_code == 200, reply.text
        found[dag_id] = sorted(run["dag_run_id"] for run in reply.json()["dag_runs"])
    return found


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _token(services: AirflowServices, user: str) -> str:
    body = {"username": user, "password": PASSWORDS[user]}
    reply = httpx.post(f"{services.api_url}/auth/token", json=body, timeout=30)
    assert reply.status_code == 201, reply.text
    return reply.json()["access_token"]


def _api(services: AirflowServices, token: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.Client(base_url=services.api_url, headers=headers, timeout=60)


def _unpause(api: httpx.Client, dag_id: str, timeout: float = 180) -> None:
    """Unpause the DAG once the DAG processor has parsed it (404 until then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = api.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False})
        if reply.status_code == 200:
            return
        time.sleep(2)
    raise AssertionError(f"DAG {dag_id} not parsed within {timeout} s: {reply.text}")


def _run_state(api: httpx.Client, dag_id: str, run_id: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json()["state"]
        if state in ("success", "failed"):
            return state
        time.sleep(2)
    raise AssertionError(f"{dag_id} {run_id} still {state} after {timeout} s")


def _start_job(api: httpx.Client, place: Path) -> None:
    overrides = {
        "source.path": str(place / "events"),
        "checkpoint.dir": str(place / "checkpoint"),
        "spark.master": "local[2]",
        "spark.shuffle_partitions": "2",
    }
    conf = {"overrides": overrides, "new_checkpoints": 1}
    reply = api.post(f"/api/v2/dags/{JOB}.start/dagRuns", json={"logical_date": None, "conf": conf})
    assert reply.status_code == 200, reply.text
    assert _run_state(api, f"{JOB}.start", reply.json()["dag_run_id"]) == "success"


def _shot(driver: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    print(f"screenshot: {path}")


def _wait(driver: Any, condition: Any, timeout: float, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.5).until(condition, what)


def _log_in(driver: Any, services: AirflowServices) -> None:
    """Airflow's own login form, as a person uses it."""
    from selenium.webdriver.common.by import By

    driver.get(f"{services.api_url}/")
    user = _wait(driver, lambda d: d.find_element(By.NAME, "username"), 60, "the login form")
    user.send_keys("admin")
    driver.find_element(By.NAME, "password").send_keys(PASSWORDS["admin"])
    _shot(driver, "01-login")
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _wait(driver, lambda d: d.get_cookie("_token"), 60, "the session cookie after login")


def _open_page(driver: Any, services: AirflowServices) -> None:
    """The nav route shows the page in Airflow's frame; the test then works inside it."""
    from selenium.webdriver.common.by import By

    driver.get(f"{services.api_url}/plugin/streamkeeper")
    frame = _wait(
        driver,
        lambda d: d.find_element(By.CSS_SELECTOR, "iframe[src*='/streamkeeper/']"),
        60,
        "the page's frame in Airflow's UI",
    )
    driver.switch_to.frame(frame)


WATCH_CSP = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`));
"""


def _savepoint_ids(driver: Any) -> set[str]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "#savepoints tbody tr[data-savepoint-id]")
    return {row.get_attribute("data-savepoint-id") for row in rows}


def test_anonymous_and_viewer_requests_are_refused_by_airflows_auth(
    airflow: tuple[AirflowServices, Path],
) -> None:
    services, place = airflow
    for path in ("/streamkeeper/", "/streamkeeper/api/jobs", f"/streamkeeper/api/jobs/{JOB}"):
        assert httpx.get(services.api_url + path, timeout=30).status_code == 401, path
    forged = httpx.get(
        f"{services.api_url}/streamkeeper/api/jobs", cookies={"_token": "forged"}, timeout=30
    )
    assert forged.status_code in (401, 403)
    admin = _api(services, _token(services, "admin"))
    for dag_id in lifecycle_dag_ids(JOB):
        _unpause(admin, dag_id)
    runs_before, files_before = _dag_run_ids(admin), _files(place / "data")
    with _api(services, _token(services, "viewer")) as viewer:
        assert viewer.get("/streamkeeper/api/jobs").json()["jobs"][0]["job"] == JOB
        for action, options in ACTIONS.items():
            url = f"/streamkeeper/api/jobs/{JOB}/actions/{action}"
            anonymous = httpx.post(services.api_url + url, json=options, timeout=30)
            assert anonymous.status_code == 401, (action, anonymous.text)
            refused = viewer.post(url, json=options)
            assert refused.status_code == 403, (action, refused.text)  # Airflow's auth manager's
    # Refused means nothing happened: no DAG run was created, no file below the root.
    assert _dag_run_ids(admin) == runs_before
    assert _files(place / "data") == files_before


def test_log_in_see_the_running_job_and_take_a_savepoint_from_the_page(
    airflow: tuple[AirflowServices, Path],
) -> None:
    from selenium.webdriver.common.by import By

    services, place = airflow
    with _api(services, _token(services, "admin")) as admin:
        for action in ("start", "savepoint"):
            _unpause(admin, f"{JOB}.{action}")
        _start_job(admin, place)

    driver = browser.start_chromium(place / "chromium-profile", place / "chromedriver.log")
    try:
        _log_in(driver, services)
        _open_page(driver, services)
        row = _wait(
            driver,
            lambda d: d.find_element(By.CSS_SELECTOR, f"tr[data-job='{JOB}'] [data-state]"),
            60,
            "the job's row",
        )
        assert row.get_attribute("data-state") == "RUNNING", row.text
        driver.switch_to.default_content()
        _shot(driver, "02-jobs-in-airflow")
        _open_page(driver, services)
        _wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, f"tr[data-job='{JOB}']"), 60, "row")
        driver.execute_script(WATCH_CSP)  # what the page draws from here must pass its CSP
        driver.find_element(By.CSS_SELECTOR, f"tr[data-job='{JOB}'] a").click()
        chart = _wait(
            driver,
            lambda d: (c := d.find_element(By.ID, "chart-rows")).get_attribute("data-points")
            not in (None, "0")
            and c,
            60,
            "a non-empty input rows/s chart",
        )
        assert int(chart.get_attribute("data-points")) >= 1
        before = _savepoint_ids(driver)
        _shot(driver, "03-job-charts")

        driver.find_element(By.CSS_SELECTOR, "button[data-action=savepoint]").click()
        dialog = _wait(driver, lambda d: d.find_element(By.ID, "confirm"), 10, "the dialog")
        assert dialog.get_attribute("open") is not None
        assert f"{JOB}.savepoint" in driver.find_element(By.ID, "confirm-conf").text
        _shot(driver, "04-confirm-savepoint")
        driver.find_element(By.ID, "confirm-ok").click()
        info = _wait(driver, lambda d: d.find_element(By.ID, "last-run-info"), 30, "the run")
        assert info.get_attribute("data-dag-id") == f"{JOB}.savepoint"
        _wait(
            driver,
            lambda d: d.find_element(By.ID, "last-run-info").get_attribute("data-state")
            in ("success", "failed"),
            300,
            "the savepoint DAG run to finish",
        )
        state = driver.find_element(By.ID, "last-run-info").get_attribute("data-state")
        assert state == "success", driver.find_element(By.ID, "last-run").text
        _wait(driver, lambda d: _savepoint_ids(d) - before, 30, "the new savepoint in the list")
        new = _savepoint_ids(driver) - before
        _shot(driver, "05-savepoint-listed")
        assert driver.execute_script("return window.cspViolations") == []
    finally:
        driver.quit()
    registry = {e.id: e for e in StreamkeeperClient(str(place / "data")).savepoints(JOB)}
    assert new <= set(registry) and len(new) == 1  # the page lists what the registry holds
