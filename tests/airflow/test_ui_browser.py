"""The operations page in a real browser, inside a real Airflow, over a real running job.

Airflow's api-server (with the streamkeeper plugin and SimpleAuthManager users `admin`
and `viewer`), scheduler, dag-processor and triggerer run on 127.0.0.1; the sample job
is started by its start DAG (a real Spark driver). Headless Chromium (Debian's, through
Selenium) logs in on Airflow's login form, opens the page from Airflow's nav route, sees
the running job's charts (uPlot: a time axis, a value axis with its unit, each series'
value at the hovered checkpoint read from the job's own history, drag to zoom and a
double-click to reset), triggers a savepoint from the page, confirms it, follows the DAG
run to success and sees the savepoint in the list. Around it: an anonymous request is
refused (401), and a viewer, who may read but not trigger DAGs, gets a 403 for every
action of the page (Airflow's auth manager decides, and the page has no credential of
its own: it forwards the user's token), and no DAG run or file results. The page runs
under its Content-Security-Policy throughout. Screenshots go to `.streamkeeper/screenshots/`
(gitignored) and are named in the output.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.components.airflow import AirflowServices, start_airflow
from jobs.keyed_totals.sample_events import write_event_files
from streamkeeper.client import Checkpoint, StreamkeeperClient
from streamkeeper_airflow.ui.actions import lifecycle_dag_ids
from tests.support import browser
from tests.support.airflow_runs import launch_record, stop_job_drivers

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
EVENT_FILES = 3  # the job reads one file a batch (maxFilesPerTrigger: 1): a checkpoint each


@pytest.fixture
def airflow(
    tmp_path: Path, conn_env: Any, monkeypatch: pytest.MonkeyPatch, airflow_db: float
) -> Iterator[tuple[AirflowServices, Path]]:
    if reason := browser.missing():
        pytest.fail(reason)
    root = tmp_path / "data"
    root.mkdir()
    write_event_files(tmp_path / "events", files=EVENT_FILES, events_per_file=200)
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


def _start_job(api: httpx.Client, place: Path) -> str:
    overrides = {
        "source.path": str(place / "events"),
        "checkpoint.dir": str(place / "checkpoint"),
        "spark.master": "local[2]",
        "spark.shuffle_partitions": "2",
    }
    conf = {"overrides": overrides, "new_checkpoints": 1}
    reply = api.post(f"/api/v2/dags/{JOB}.start/dagRuns", json={"logical_date": None, "conf": conf})
    assert reply.status_code == 200, reply.text
    run_id = reply.json()["dag_run_id"]
    assert _run_state(api, f"{JOB}.start", run_id) == "success"
    return run_id


def _check_driver_log_link(driver: Any, api: httpx.Client, run_id: str, place: Path) -> None:
    """The start task's *Driver log* link, as Airflow's API lists it, opened in the
    logged-in browser: the tail of the file the launch record names."""
    from selenium.webdriver.common.by import By

    links = api.get(f"/api/v2/dags/{JOB}.start/dagRuns/{run_id}/taskInstances/start/links")
    assert links.status_code == 200, links.text
    url = links.json()["extra_links"]["Driver log"]
    assert url.endswith(f"/streamkeeper/api/jobs/{JOB}/driver-log"), url
    driver.get(url if "://" in url else str(api.base_url.join(url)))
    text = driver.find_element(By.TAG_NAME, "body").text
    log = Path(launch_record(place / "data", JOB)["log"])
    header, body = text.split("\n", 1)
    assert str(log) in header and "the last" in header, header
    written = log.read_text()  # the driver keeps writing: what the page showed came first
    lines = [line for line in body.splitlines() if line.strip()]
    assert len(lines) > 10 and all(line in written for line in lines[-10:]), lines[-10:]


def _shot(driver: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    print(f"screenshot: {path}")


def _wait(driver: Any, condition: Any, timeout: float, what: str) -> Any:
    """Wait for `condition`, asking again when the page re-rendered an element between
    finding it and reading it (the page refreshes on its own while the test reads)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    waiting = WebDriverWait(
        driver, timeout, poll_frequency=0.5, ignored_exceptions=[StaleElementReferenceException]
    )
    return waiting.until(condition, what)


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
    # In one script: the page replaces the rows on each refresh, so rows found by one
    # call can be gone by the next.
    return set(
        driver.execute_script(
            "return [...document.querySelectorAll("
            "'#savepoints tbody tr[data-savepoint-id]')].map((row) => row.dataset.savepointId)"
        )
    )


# Ink (non-transparent pixels) that uPlot drew on its canvas left of the plot area (the
# value axis: ticks and unit label), below it (the time axis) and inside it (the lines).
CANVAS_INK = """
const chart = arguments[0];
const canvas = chart.querySelector(".uplot canvas");
const c = canvas.getBoundingClientRect();
const o = chart.querySelector(".u-over").getBoundingClientRect();
const ratio = canvas.width / c.width;
const context = canvas.getContext("2d");
const ink = (x, y, w, h) => {
  const pixels = context.getImageData(x * ratio, y * ratio, w * ratio, h * ratio).data;
  let count = 0;
  for (let i = 3; i < pixels.length; i += 4) if (pixels[i]) count += 1;
  return count;
};
return {
  value_axis: ink(0, 0, o.left - c.left, c.height),
  time_axis: ink(0, o.bottom - c.top, c.width, c.bottom - o.bottom),
  plot: ink(o.left - c.left, o.top - c.top, o.width, o.height),
};
"""
CLOCK = re.compile(r"\b\d{2}:\d{2}:\d{2}\b")


def _legend(chart: Any) -> dict[str, str]:
    """The chart's legend: series label -> the value shown for the hovered checkpoint."""
    from selenium.webdriver.common.by import By

    return {
        row.find_element(By.CSS_SELECTOR, ".u-label").text.rstrip(":"): row.find_element(
            By.CSS_SELECTOR, ".u-value"
        ).text
        for row in chart.find_elements(By.CSS_SELECTOR, ".u-legend .u-series")
    }


def _hover(driver: Any, chart: Any, fraction: float, shown_before: str = "--") -> dict[str, str]:
    """Moves the mouse over the plot at `fraction` of its width; returns the legend once
    its time differs from `shown_before` (uPlot shows `--` while nothing is hovered)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    plot = chart.find_element(By.CSS_SELECTOR, ".u-over")
    offset = round(plot.size["width"] * (fraction - 0.5))  # from the plot's centre
    ActionChains(driver).move_to_element_with_offset(plot, offset, 0).perform()
    return _wait(
        driver, lambda _: (shown := _legend(chart))["time"] != shown_before and shown, 5, "hover"
    )


def _rate(shown: str) -> float:
    """`1,234.5 rows/s` -> 1234.5"""
    number, unit = shown.split(" ", 1)
    assert unit == "rows/s", shown
    return float(number.replace(",", ""))


def _assert_legend_shows(shown: dict[str, str], history: dict[int, Checkpoint]) -> int:
    """The hovered checkpoint's time and rates, as the job's history holds them."""
    match = re.search(r"checkpoint (\d+)$", shown["time"])
    assert match, shown
    row = history[int(match.group(1))]
    local = datetime.fromisoformat(row.trigger_time).astimezone()  # the browser's zone
    assert local.strftime("%H:%M:%S") in shown["time"], (shown, row.trigger_time)
    assert _rate(shown["input"]) == pytest.approx(row.input_rows_per_second, abs=0.051)
    assert _rate(shown["processed"]) == pytest.approx(row.processed_rows_per_second, abs=0.051)
    return row.checkpoint_id


def _x_range(chart: Any) -> tuple[float, float, str]:
    low, high = chart.get_attribute("data-x-min"), chart.get_attribute("data-x-max")
    return float(low), float(high), chart.get_attribute("data-x-ticks")


def _check_rows_chart(driver: Any, chart: Any, data: Path) -> None:
    """Axes with times and the unit; hovered values from the job's history; drag zooms."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    ink = driver.execute_script(CANVAS_INK, chart)
    assert min(ink.values()) > 0, ink  # both axes and the lines are drawn
    assert chart.get_attribute("data-y-label") == "rows/s"
    assert "(rows/s)" in chart.find_element(By.TAG_NAME, "h4").text
    ticks = chart.get_attribute("data-x-ticks").split("|")
    assert ticks and all(CLOCK.search(tick) for tick in ticks), ticks
    assert chart.get_attribute("data-y-ticks"), "no value axis ticks"

    left = _hover(driver, chart, 0.01)
    right = _hover(driver, chart, 0.99, shown_before=left["time"])
    rows = StreamkeeperClient(str(data)).history(JOB, last=200)  # oldest first
    history = {row.checkpoint_id: row for row in rows}
    assert set(left) == {"time", "input", "processed"}, left
    first, last = _assert_legend_shows(left, history), _assert_legend_shows(right, history)
    assert (first, last) == (rows[0].checkpoint_id, rows[-1].checkpoint_id)
    _shot(driver, "03-job-charts-hover")

    low, high, ticks_before = _x_range(chart)
    plot = chart.find_element(By.CSS_SELECTOR, ".u-over")
    width = plot.size["width"]
    drag = ActionChains(driver).move_to_element_with_offset(plot, round(-0.4 * width), 0)
    drag.click_and_hold().move_by_offset(round(0.5 * width), 0).release().perform()
    zoomed = _wait(
        driver, lambda _: _x_range(chart)[:2] != (low, high) and _x_range(chart), 5, "zoom"
    )
    assert low < zoomed[0] < zoomed[1] < high, (low, high, zoomed)
    assert zoomed[2] != ticks_before and CLOCK.search(zoomed[2]), zoomed
    _shot(driver, "03-job-charts-zoomed")
    ActionChains(driver).double_click(plot).perform()
    _wait(driver, lambda _: _x_range(chart) == (low, high, ticks_before), 5, "the zoom reset")


def test_anonymous_and_viewer_requests_are_refused_by_airflows_auth(
    airflow: tuple[AirflowServices, Path],
) -> None:
    services, place = airflow
    for path in (
        "/streamkeeper/",
        "/streamkeeper/api/jobs",
        f"/streamkeeper/api/jobs/{JOB}",
        f"/streamkeeper/api/jobs/{JOB}/driver-log",
    ):
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
        start_run = _start_job(admin, place)

    driver = browser.start_chromium(place / "chromium-profile", place / "chromedriver.log")
    try:
        _log_in(driver, services)
        with _api(services, _token(services, "admin")) as admin:
            _check_driver_log_link(driver, admin, start_run, place)
        _open_page(driver, services)
        state = _wait(
            driver,
            lambda d: d.find_element(
                By.CSS_SELECTOR, f"tr[data-job='{JOB}'] [data-state]"
            ).get_attribute("data-state"),
            60,
            "the job's row",
        )
        assert state == "RUNNING", driver.find_element(By.ID, "jobs").text
        driver.switch_to.default_content()
        _shot(driver, "02-jobs-in-airflow")
        _open_page(driver, services)
        _wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, f"tr[data-job='{JOB}']"), 60, "row")
        driver.execute_script(WATCH_CSP)  # what the page draws from here must pass its CSP
        driver.find_element(By.CSS_SELECTOR, f"tr[data-job='{JOB}'] a").click()
        chart = _wait(
            driver,
            lambda d: int(
                (c := d.find_element(By.ID, "chart-rows")).get_attribute("data-checkpoints") or 0
            )
            >= EVENT_FILES
            and c,
            60,
            "a checkpoint per events file in the rows/s chart",
        )
        assert int(chart.get_attribute("data-points")) >= 2 * EVENT_FILES  # input, processed
        _shot(driver, "03-job-charts")
        _check_rows_chart(driver, chart, place / "data")
        before = _savepoint_ids(driver)

        driver.find_element(By.CSS_SELECTOR, "button[data-action=savepoint]").click()
        dialog = _wait(driver, lambda d: d.find_element(By.ID, "confirm"), 10, "the dialog")
        assert dialog.get_attribute("open") is not None
        assert f"{JOB}.savepoint" in driver.find_element(By.ID, "confirm-conf").text
        _shot(driver, "04-confirm-savepoint")
        driver.find_element(By.ID, "confirm-ok").click()
        dag_id = _wait(
            driver,
            lambda d: d.find_element(By.ID, "last-run-info").get_attribute("data-dag-id"),
            30,
            "the run",
        )
        assert dag_id == f"{JOB}.savepoint"
        state = _wait(
            driver,
            lambda d: (
                (s := d.find_element(By.ID, "last-run-info").get_attribute("data-state"))
                in ("success", "failed")
                and s
            ),
            300,
            "the savepoint DAG run to finish",
        )
        assert state == "success", driver.find_element(By.ID, "last-run").text
        _wait(driver, lambda d: _savepoint_ids(d) - before, 30, "the new savepoint in the list")
        new = _savepoint_ids(driver) - before
        _shot(driver, "05-savepoint-listed")
        assert driver.execute_script("return window.cspViolations") == []
    finally:
        driver.quit()
    registry = {e.id: e for e in StreamkeeperClient(str(place / "data")).savepoints(JOB)}
    assert new <= set(registry) and len(new) == 1  # the page lists what the registry holds
