// The operations page: the jobs table, one open job's charts and lists, and actions.
// Plain JavaScript, no build step and nothing loaded from outside: Airflow serves it
// from its own api-server, often on a closed network. The one library, uPlot (charts),
// is vendored in static/vendor/ (infra/vendor_ui.sh) and loaded before this file.
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

// -- charts (uPlot, vendored in static/vendor/) ------------------------------------------
// x is the checkpoint's trigger time (local time), y carries its unit on the axis; the
// legend shows each series' value at the hovered checkpoint, in every chart at once.
// Dragging on a chart zooms all of them to that time range, a double-click resets it; a
// refresh keeps a zoom.

const CHART_HEIGHT = 200;
const NUMBER = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
const COMPACT = new Intl.NumberFormat("en-US", { notation: "compact", maximumFractionDigits: 1 });
const CLOCK = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });
const DAY = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric" });
// Byte axes step by 1, 2 or 5 KiB, MiB, ... (ticks at 20 KiB, 25 KiB, not 19.5 KiB, 24.4 KiB).
const BINARY_STEPS = [0, 1, 2, 3, 4].flatMap((power) => [1, 2, 5, 10, 20, 50, 100, 200, 500].map((step) => step * 1024 ** power));
const UNITS = {
  ms: { label: "ms", tick: (v) => COMPACT.format(v), value: (v) => `${NUMBER.format(v)} ms` },
  rate: { label: "rows/s", tick: (v) => COMPACT.format(v), value: (v) => `${NUMBER.format(v)} rows/s` },
  bytes: { label: "bytes", tick: (v) => bytes(v).replace(".0 ", " "), value: bytes, steps: BINARY_STEPS },
};
const charts = new Map(); // chart id -> { box, holder, note, plot, shape, fingerprint, ids, resizing }

function chartSpecs(history) {
  return [
    ["duration", "Checkpoint duration and its parts", UNITS.ms, { total: history.duration_ms, ...history.duration_parts_ms }],
    ["rows", "Input and processing rate", UNITS.rate, { input: history.input_rows_per_second, processed: history.processed_rows_per_second }],
    ["state", "State size per operator", UNITS.bytes, history.state_bytes_by_operator],
    ["uploaded", "Bytes uploaded to object storage", UNITS.bytes, { uploaded: history.bytes_uploaded }],
    ["visibility", "Visibility delay (commit after the batch)", UNITS.ms, { delay: history.visibility_delay_ms }],
  ].map(([id, title, unit, series]) => ({ id, title, unit, series }));
}

// The checkpoints with a readable trigger time, oldest first (uPlot needs x ascending).
function timeline(history) {
  const order = history.trigger_time
    .map((stamp, i) => [Date.parse(stamp) / 1000, i])
    .filter(([seconds]) => Number.isFinite(seconds))
    .sort((a, b) => a[0] - b[0]);
  return {
    times: order.map(([seconds]) => seconds),
    ids: order.map(([, i]) => history.checkpoint_id[i]),
    pick: (values) => order.map(([, i]) => values[i] ?? null),
  };
}

function renderCharts(history) {
  const box = $("#charts");
  const specs = history && history.checkpoint_id.length ? chartSpecs(history) : [];
  for (const [id, chart] of charts) {
    if (specs.some((spec) => spec.id === id)) continue;
    chart.resizing.disconnect();
    chart.plot?.destroy();
    charts.delete(id);
  }
  const nodes = specs.length
    ? specs.map((spec) => chartBox(spec).box)
    : [el("p", { class: "muted" }, "No checkpoints yet.")];
  if (nodes.length !== box.children.length || nodes.some((node, i) => box.children[i] !== node)) {
    box.replaceChildren(...nodes); // only when the set changed: moving a chart ends a hover
  }
  if (!specs.length) return;
  const line = timeline(history);
  for (const spec of specs) plotChart(charts.get(spec.id), spec, line);
}

function chartBox(spec) {
  if (!charts.has(spec.id)) {
    const holder = el("div", { class: "plot" });
    const note = el("div", { class: "muted chart-note" });
    const box = el("div", { class: "chart", id: `chart-${spec.id}` },
      el("h4", {}, `${spec.title} (${spec.unit.label})`), holder, note);
    const chart = { box, holder, note, plot: null, shape: null, fingerprint: null, ids: [] };
    chart.resizing = new ResizeObserver(() => {
      const width = holder.clientWidth;
      if (chart.plot && width && width !== chart.plot.width) chart.plot.setSize({ width, height: CHART_HEIGHT });
    });
    chart.resizing.observe(holder);
    charts.set(spec.id, chart);
  }
  return charts.get(spec.id);
}

function plotChart(chart, spec, line) {
  const names = Object.keys(spec.series);
  const data = [line.times, ...names.map((name) => line.pick(spec.series[name]))];
  const shape = JSON.stringify([view.job, view.window, names]);
  const fingerprint = JSON.stringify(data);
  chart.ids = line.ids;
  describeChart(chart, data);
  if (chart.plot && chart.shape === shape) {
    if (chart.fingerprint !== fingerprint) chart.plot.setData(data, !zoomed(chart.plot));
  } else {
    chart.plot?.destroy();
    chart.holder.replaceChildren();
    chart.plot = new uPlot(plotOptions(chart, spec, names), data, chart.holder);
  }
  chart.shape = shape;
  chart.fingerprint = fingerprint;
}

function zoomed(plot) {
  const xs = plot.data[0];
  return xs.length > 1 && (plot.scales.x.min > xs[0] || plot.scales.x.max < xs[xs.length - 1]);
}

// The chart's data-* attributes say what it shows, for people and the browser test
// (uPlot draws on a canvas): data-points, data-checkpoints, and from plotOptions the
// drawn tick labels (data-x-ticks, data-y-ticks), the value axis' label and the x range.
function describeChart(chart, data) {
  const points = data.slice(1).flat().filter((v) => v !== null).length;
  const ids = chart.ids;
  chart.box.dataset.points = points;
  chart.box.dataset.checkpoints = ids.length;
  chart.note.textContent = points
    ? `checkpoints ${ids[0]}-${ids[ids.length - 1]}; drag to zoom, double-click to reset`
    : "no values in this window";
}

function plotOptions(chart, spec, names) {
  const record = (key, labels) => { chart.box.dataset[key] = labels.join("|"); return labels; };
  return {
    width: chart.holder.clientWidth || 400,
    height: CHART_HEIGHT,
    cursor: { sync: { key: "streamkeeper" } }, // hovering or zooming one chart moves them all
    scales: { x: { time: true } },
    series: [
      {
        label: "time",
        value: (u, seconds, si, idx) => (idx === null || seconds === null ? null
          : `${DAY.format(seconds * 1000)} ${CLOCK.format(seconds * 1000)}, checkpoint ${chart.ids[idx]}`),
      },
      ...names.map((name, i) => ({
        label: name.replace(/_ms$/, "").replaceAll("_", " "),
        stroke: COLORS[i % COLORS.length],
        width: 1.5,
        value: (u, v) => (v === null || v === undefined ? null : spec.unit.value(v)),
      })),
    ],
    axes: [
      {
        space: 80,
        values: (u, splits, ai, space, increment) => record("xTicks", timeTicks(splits, increment)),
      },
      {
        label: spec.unit.label,
        incrs: spec.unit.steps, // undefined: uPlot's decimal steps
        size: (u, labels) => 20 + 7 * Math.max(3, ...(labels ?? []).map((text) => text.length)),
        values: (u, splits) => record("yTicks", splits.map((v) => (v === null ? "" : spec.unit.tick(v)))),
      },
    ],
    hooks: {
      draw: [(u) => { chart.box.dataset.yLabel = u.axes[1].label; }],
      setScale: [(u, key) => {
        if (key === "x") Object.assign(chart.box.dataset, { xMin: u.scales.x.min, xMax: u.scales.x.max });
      }],
    },
  };
}

// Local clock time on each tick; the day under the first tick and wherever it changes.
function timeTicks(splits, increment) {
  let lastDay = null;
  return splits.map((seconds) => {
    if (seconds === null) return "";
    const date = new Date(seconds * 1000);
    let text = CLOCK.format(date);
    if (increment < 1) text += `.${String(date.getMilliseconds()).padStart(3, "0")}`;
    const day = DAY.format(date);
    if (day !== lastDay) text += `\n${day}`;
    lastDay = day;
    return text;
  });
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
