// The operations page: the jobs table, one open job's charts and lists, and actions.
// Plain JavaScript, no build step and nothing loaded from outside: Airflow serves it
// from its own api-server, often on a closed network.
"use strict";

const BASE = location.pathname.replace(/\/?$/, "/");
const REFRESH_MS = 5000;
const FINAL_RUN_STATES = ["success", "failed"];
const COLORS = ["#3182ce", "#dd6b20", "#38a169", "#805ad5", "#d53f8c", "#718096"];
const view = { offset: 0, limit: 20, q: "", job: null, window: 200, detail: null, lastRun: null };

function $(selector) { return document.querySelector(selector); }

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

async function api(path, options = {}) {
  const response = await fetch(BASE + path, {
    credentials: "same-origin",
    ...options,
    headers: { "Content-Type": "application/json", "X-Streamkeeper-Page": "1", ...(options.headers || {}) },
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail ?? body);
    throw new Error(`${response.status}: ${detail}`);
  }
  return body;
}

function showError(error) {
  const box = $("#error");
  box.hidden = !error;
  box.textContent = error ? String(error.message || error) : "";
}

// -- formatting ------------------------------------------------------------------------

function age(seconds) {
  if (seconds === null || seconds === undefined) return "";
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["min", 60]]) {
    if (seconds >= size) return `${Math.floor(seconds / size)} ${unit}`;
  }
  return `${Math.floor(seconds)} s`;
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function when(epochSeconds) {
  return epochSeconds ? new Date(epochSeconds * 1000).toLocaleString() : "";
}

function ms(value) { return value === null || value === undefined ? "" : `${Math.round(value)} ms`; }

function stateBadge(state) { return el("span", { class: `state ${state}`, "data-state": state }, state); }

// -- the jobs table --------------------------------------------------------------------

async function refreshJobs() {
  const query = new URLSearchParams({ q: view.q, offset: view.offset, limit: view.limit });
  const page = await api(`api/jobs?${query}`);
  const body = $("#jobs tbody");
  body.replaceChildren(...page.jobs.map(jobRow));
  const last = Math.min(page.offset + page.limit, page.total);
  $("#range").textContent = page.total ? `${page.offset + 1}-${last} of ${page.total}` : "no jobs";
  $("#prev").disabled = page.offset === 0;
  $("#next").disabled = last >= page.total;
  $("#updated").textContent = `updated ${new Date(page.generated_at * 1000).toLocaleTimeString()}`;
}

function jobRow(job) {
  const row = el(
    "tr",
    { class: job.job === view.job ? "job selected" : "job", "data-job": job.job },
    el("td", {}, el("a", { href: `#job=${encodeURIComponent(job.job)}` }, job.job)),
    el("td", {}, stateBadge(job.state), el("span", { class: "reason" }, job.reason)),
    el("td", {}, job.epoch ?? ""),
    el("td", {}, job.runner ? `${job.runner_state} ${job.runner}` : ""),
    el("td", {}, job.last_checkpoint_id ?? ""),
    el("td", {}, age(job.last_checkpoint_age_s)),
    el("td", {}, ms(job.visibility_delay_ms)),
    el("td", {}, job.pending_commits ?? ""),
  );
  row.addEventListener("click", () => { location.hash = `job=${encodeURIComponent(job.job)}`; });
  return row;
}

// -- one job ---------------------------------------------------------------------------

async function refreshDetail() {
  if (!view.job) { $("#detail").hidden = true; return; }
  const detail = await api(`api/jobs/${encodeURIComponent(view.job)}?window=${view.window}`);
  view.detail = detail;
  $("#detail").hidden = false;
  $("#detail-job").textContent = view.job;
  $("#detail-state").replaceChildren(stateBadge(detail.summary.state));
  $("#detail-reason").textContent = detail.summary.reason;
  const select = $("#window");
  if (!select.options.length) {
    for (const w of detail.windows) select.append(el("option", { value: w }, `last ${w} checkpoints`));
    select.value = String(view.window);
  }
  renderCharts(detail.history);
  renderSavepoints(detail.savepoints);
  renderUpgrades(detail.upgrades);
  await refreshRuns();
}

function renderSavepoints(savepoints) {
  $("#savepoints tbody").replaceChildren(...savepoints.map((sp) => {
    const rollback = el("button", { type: "button", "data-rollback": sp.id }, "Roll back to this");
    rollback.disabled = sp.state !== "complete";
    rollback.addEventListener("click", () => confirmAction("rollback", { savepoint_id: sp.id }));
    return el(
      "tr", { "data-savepoint-id": sp.id },
      el("td", {}, sp.id), el("td", {}, sp.format), el("td", {}, sp.storage),
      el("td", {}, bytes(sp.size)),
      el("td", {}, sp.protected ? `yes${sp.protected_reason ? ` (${sp.protected_reason})` : ""}` : "no"),
      el("td", {}, `${when(sp.created_at)}${sp.state === "complete" ? "" : ` (${sp.state})`}`),
      el("td", {}, rollback),
    );
  }));
}

function renderUpgrades(upgrades) {
  $("#upgrades tbody").replaceChildren(...upgrades.map((up) => {
    let validation = "not yet";
    if (up.validation_passed === true) validation = "passed";
    if (up.validation_passed === false) validation = `failed: ${up.validation_reason ?? ""}`;
    return el(
      "tr", { "data-upgrade-id": up.id },
      el("td", {}, up.id),
      el("td", {}, up.phase, up.reason ? el("span", { class: "reason" }, up.reason) : ""),
      el("td", { title: JSON.stringify(up.validation ?? {}) }, validation),
      el("td", {}, up.handover_gap_s === null || up.handover_gap_s === undefined ? "" : `${up.handover_gap_s} s`),
      el("td", {}, when(up.created_at)),
    );
  }));
}

async function refreshRuns() {
  let reply;
  try {
    reply = await api(`api/jobs/${encodeURIComponent(view.job)}/runs`);
  } catch (error) {
    $("#runs tbody").replaceChildren(el("tr", {}, el("td", { colspan: 4, class: "error" }, error.message)));
    return;
  }
  $("#runs tbody").replaceChildren(...(reply.dag_runs || []).map((run) => el(
    "tr", { "data-run-id": run.dag_run_id },
    el("td", {}, run.dag_id),
    el("td", {}, el("a", { href: `/dags/${run.dag_id}/runs/${encodeURIComponent(run.dag_run_id)}`, target: "_top" }, run.dag_run_id)),
    el("td", {}, stateBadge(run.state)),
    el("td", {}, run.start_date ? new Date(run.start_date).toLocaleString() : ""),
  )));
}

// -- charts (SVG, no library) ------------------------------------------------------------

function renderCharts(history) {
  const box = $("#charts");
  if (!history) { box.replaceChildren(el("p", { class: "muted" }, "No checkpoints yet.")); return; }
  const x = history.checkpoint_id;
  const charts = [
    ["duration", "Checkpoint duration and its parts (ms)", { total: history.duration_ms, ...history.duration_parts_ms }],
    ["rows", "Input rows/s", { input: history.input_rows_per_second, processed: history.processed_rows_per_second }],
    ["state", "State size per operator (bytes)", history.state_bytes_by_operator],
    ["uploaded", "Bytes uploaded", { uploaded: history.bytes_uploaded }],
    ["visibility", "Visibility delay (ms)", { delay: history.visibility_delay_ms }],
  ];
  box.replaceChildren(...charts.map(([id, title, series]) => lineChart(id, title, x, series)));
}

function lineChart(id, title, xs, series) {
  const width = 400, height = 150, pad = 4;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const values = Object.values(series).flat().filter((v) => v !== null && v !== undefined);
  const top = Math.max(1, ...values);
  const span = Math.max(1, xs.length - 1);
  const legend = el("div", { class: "legend" });
  let points = 0;
  Object.entries(series).forEach(([name, ys], index) => {
    const color = COLORS[index % COLORS.length];
    const coords = [];
    ys.forEach((y, i) => {
      if (y === null || y === undefined) return;
      coords.push(`${pad + (i / span) * (width - 2 * pad)},${height - pad - (y / top) * (height - 2 * pad)}`);
    });
    points += coords.length;
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", coords.join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", color);
    line.setAttribute("stroke-width", "1.5");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(line);
    const swatch = el("i");
    swatch.style.background = color; // CSSOM, not a style attribute: the CSP allows no inline styles
    legend.append(el("span", {}, swatch, name));
  });
  let range = `checkpoints ${xs[0]}-${xs[xs.length - 1]}, max ${Math.round(top)}`;
  if (!values.length) range = "no values in this window";
  return el("div", { class: "chart", id: `chart-${id}`, "data-points": points },
    el("h4", {}, title), svg, legend, el("div", { class: "muted" }, range));
}

// -- actions ---------------------------------------------------------------------------

const ACTION_TEXT = {
  savepoint: ["Savepoint now", "Triggers a savepoint DAG run: the running job takes a savepoint between two batches."],
  stop: ["Stop with savepoint", "Triggers a stop DAG run: the job takes a savepoint, then stops."],
  restart: ["Restart from latest checkpoint", "Triggers a start DAG run from the newest checkpoint, local or externalized."],
  upgrade: ["Upgrade", "Triggers a blue-green upgrade DAG run to the chosen spec (validated, then handed over)."],
  rollback: ["Roll back", "Triggers a rollback DAG run: tables restored to the savepoint, the job restarted from it."],
};

function optionsForm(action, fixed) {
  const box = $("#confirm-options");
  box.replaceChildren();
  if (action === "savepoint" || action === "stop") {
    const select = el("select", { name: "format" }, el("option", { value: "native" }, "native"), el("option", { value: "canonical" }, "canonical"));
    box.append(el("label", {}, "Format ", select));
  }
  if (action === "restart") {
    box.append(el("label", {}, el("input", { type: "checkbox", name: "takeover" }), " take over a live runner (fences it)"));
  }
  if (action === "upgrade") {
    const specs = view.detail?.upgrade_specs ?? [];
    const input = el("input", { name: "green_spec_path", list: "spec-choices", size: 60, value: specs[0] ?? "" });
    const list = el("datalist", { id: "spec-choices" }, ...specs.map((s) => el("option", { value: s })));
    box.append(el("label", {}, "New version's spec ", input), list);
  }
  const readOptions = () => {
    const options = { ...fixed };
    for (const field of box.querySelectorAll("[name]")) {
      options[field.name] = field.type === "checkbox" ? field.checked : field.value;
    }
    return options;
  };
  const show = () => { $("#confirm-conf").textContent = `DAG ${view.job}.${action === "restart" ? "start" : action}\n${JSON.stringify(readOptions(), null, 1)}`; };
  box.oninput = show;
  show();
  return readOptions;
}

function confirmAction(action, fixed = {}) {
  const dialog = $("#confirm");
  const [title, text] = ACTION_TEXT[action];
  $("#confirm-title").textContent = `${title}: ${view.job}`;
  $("#confirm-text").textContent = text;
  dialog.dataset.action = action;
  const readOptions = optionsForm(action, fixed);
  dialog.onclose = () => {
    if (dialog.returnValue === "ok") trigger(action, readOptions());
  };
  dialog.returnValue = "";
  dialog.showModal();
}

async function trigger(action, options) {
  const job = view.job;
  const out = $("#last-run");
  out.textContent = `triggering ${action}...`;
  try {
    const run = await api(`api/jobs/${encodeURIComponent(job)}/actions/${action}`, {
      method: "POST", body: JSON.stringify(options),
    });
    view.lastRun = { dag_id: run.dag_id, run_id: run.dag_run_id, state: run.state };
    showLastRun();
    pollRun(view.lastRun);
  } catch (error) {
    out.replaceChildren(el("span", { class: "error", "data-run-error": action }, `${action} refused: ${error.message}`));
  }
}

function showLastRun() {
  const run = view.lastRun;
  if (!run) return;
  $("#last-run").replaceChildren(
    el("span", { id: "last-run-info", "data-dag-id": run.dag_id, "data-run-id": run.run_id, "data-state": run.state },
      `DAG run ${run.run_id} of ${run.dag_id}: `), stateBadge(run.state));
}

async function pollRun(run) {
  while (view.lastRun === run && !FINAL_RUN_STATES.includes(run.state)) {
    await new Promise((resolve) => setTimeout(resolve, 2000));
    try {
      const reply = await api(`api/dag-runs/${encodeURIComponent(run.dag_id)}/${encodeURIComponent(run.run_id)}`);
      run.state = reply.state;
      showLastRun();
    } catch (error) {
      showError(error);
    }
  }
  if (view.lastRun === run) refreshDetail().catch(showError);
}

// -- wiring ----------------------------------------------------------------------------

function jobFromHash() {
  const match = location.hash.match(/job=([^&]+)/);
  return match ? decodeURIComponent(match[1]) : null;
}

async function refresh() {
  try {
    await refreshJobs();
    await refreshDetail();
    showError(null);
  } catch (error) {
    showError(error);
  }
}

function start() {
  view.job = jobFromHash();
  window.addEventListener("hashchange", () => { view.job = jobFromHash(); view.lastRun = null; $("#last-run").replaceChildren(); refresh(); });
  let typing;
  $("#filter").addEventListener("input", (event) => {
    clearTimeout(typing);
    typing = setTimeout(() => { view.q = event.target.value; view.offset = 0; refresh(); }, 300);
  });
  $("#prev").addEventListener("click", () => { view.offset = Math.max(0, view.offset - view.limit); refresh(); });
  $("#next").addEventListener("click", () => { view.offset += view.limit; refresh(); });
  $("#window").addEventListener("change", (event) => { view.window = Number(event.target.value); refresh(); });
  for (const button of document.querySelectorAll("[data-action]")) {
    button.addEventListener("click", () => confirmAction(button.dataset.action));
  }
  refresh();
  setInterval(refresh, REFRESH_MS);
}

start();
