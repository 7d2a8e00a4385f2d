// Compare page: side-by-side table and overlays of useful TFLOP/s and step time for the chosen
// runs. Ids the server does not know are named, and the rest are compared.

import * as api from "./api.js";
import { loadCatalogue, metricOf } from "./catalogue.js";
import { runColor } from "./colors.js";
import { display, signed } from "./format.js";
import { ChartPanel, fill, layout, line } from "./charts.js";
import { metricLabel, renderDefinitions } from "./definitions.js";
import { el, showError, statusBadge } from "./dom.js";

const requestedIds = JSON.parse(document.getElementById("compare").dataset.runIds);
const MAX_POINTS = 500;
const REFRESH_MS = 5000;

// Rows of the table, useful work first. delta: how a run differs from the first one —
// "rel" in percent, "pp" in percentage points (for shares and fractions).
const ROWS = [
  { name: "tflops_useful", delta: "rel", headline: true },
  { name: "real_tokens_per_gpu_s", delta: "rel" },
  { name: "padding_pct", delta: "pp" },
  { name: "step_time_s", delta: "rel" },
  { name: "tflops_thd", delta: "rel" },
  { name: "tflops_bshd", delta: "rel" },
  { name: "overcount_pct", delta: "pp" },
  { name: "mfu_useful", delta: "pp" },
  { name: "tokens_per_gpu_s", delta: "rel" },
  { name: "syncs_per_iter", delta: "rel" },
  { name: "steps" },
];

const panels = {
  tflops: new ChartPanel(document.getElementById("chart-tflops"), { filename: "compare-tflops.csv" }),
  step_time: new ChartPanel(document.getElementById("chart-step_time"), { filename: "compare-step-time.csv" }),
};

// Names need not be unique; fall back to the id where two runs share one.
function labels(runs) {
  const counts = new Map();
  for (const run of runs) counts.set(run.name, (counts.get(run.name) || 0) + 1);
  return runs.map((run) => (run.name && counts.get(run.name) === 1 ? run.name : run.run_id));
}

function delta(row, metric, value, reference) {
  if (!row.delta || value === null || value === undefined || !reference) return null;
  // A fraction (format ".1%") differs in points of its percentage.
  const scale = metric.format.endsWith("%") ? 100 : 1;
  const change = row.delta === "pp" ? (value - reference) * scale : (100 * (value - reference)) / reference;
  return el("div", { class: "delta muted small", text: signed(change, row.delta === "pp" ? "pp" : "%") });
}

// The server's rank test of each run's recent step times against the first run's.
function verdict(test) {
  if (!test || test.p_value === null) return el("span", { class: "muted small", text: "too few intervals" });
  const significant = test.p_value < 0.01;
  return el("div", {}, [
    el("div", { text: significant ? "different" : "no clear difference" }),
    el("div", { class: "muted small", text: `p = ${test.p_value < 1e-4 ? test.p_value.toExponential(1) : test.p_value.toFixed(4)} · last ${test.n} vs ${test.n_baseline} intervals` }),
  ]);
}

function renderTable(catalogue, runs, names, tests) {
  const head = el("thead", {}, el("tr", {}, [
    el("th", { text: "" }),
    ...runs.map((run, i) =>
      el("th", { class: "num" }, [
        el("span", { class: "run-swatch", style: `background:${runColor(i)}` }),
        el("a", { href: api.runPageUrl(run.run_id), text: names[i] }),
        el("div", { class: "muted small" }, [`${run.layout} · `, statusBadge(run.status)]),
      ]),
    ),
  ]));
  const reference = runs[0].totals || {};
  const rows = ROWS.map((row) => {
    const metric = metricOf(catalogue, row.name);
    return el("tr", { class: row.headline ? "headline" : null, "data-metric": row.name }, [
      el("th", { scope: "row" }, metricLabel(metric)),
      ...runs.map((run, i) => {
        const value = run.totals ? run.totals[row.name] : null;
        return el("td", { class: "num" }, [
          el("div", { class: "value", text: display(metric, value) }),
          i > 0 ? delta(row, metric, value, reference[row.name]) : null,
        ]);
      }),
    ]);
  });
  const byRun = new Map(tests.map((t) => [t.run_id, t]));
  rows.push(el("tr", {}, [
    el("th", { scope: "row", title: "Mann-Whitney U on per-interval step times; p < 0.01 counts as different" }, "Step time vs first run"),
    ...runs.map((run, i) => el("td", { class: "num" }, i > 0 ? [verdict(byRun.get(run.run_id))] : [el("span", { class: "muted small", text: "reference" })])),
  ]));
  document.getElementById("compare-table").replaceChildren(head, el("tbody", {}, rows));
}

function named(trace, name, csv) {
  return { ...trace, meta: { ...trace.meta, csv }, name };
}

// Per run: useful TFLOP/s solid (plotted first, the honest number across layouts), THD-corrected dashed.
function renderCharts(m, runs, names, seriesList) {
  const tflops = [];
  const stepTime = [];
  runs.forEach((run, i) => {
    const series = seriesList[i];
    if (!series.points) return;
    const color = runColor(i);
    const useful = line("tflops_useful", m("tflops_useful"), color, { name: `${names[i]} · useful` });
    const thd = line("tflops_thd", m("tflops_thd"), color, { name: `${names[i]} · THD-corrected`, dash: "dash", width: 1.5 });
    const step = line("step_time_s", m("step_time_s"), color, { name: names[i] });
    tflops.push(...fill([named(useful, useful.name, `${names[i]}:tflops_useful`), named(thd, thd.name, `${names[i]}:tflops_thd`)], series.columns));
    stepTime.push(...fill([named(step, names[i], `${names[i]}:step_time_s`)], series.columns));
  });
  if (!tflops.length) {
    panels.tflops.showEmpty("Waiting for the first interval…");
    panels.step_time.showEmpty("Waiting for the first interval…");
    return;
  }
  panels.tflops.draw(tflops, layout({ yTitle: "TFLOP/s per GPU", metric: m("tflops_useful") }));
  panels.step_time.draw(stepTime, layout({ yTitle: "seconds per step", metric: m("step_time_s") }));
}

// The compare API answers 404 for the whole set when any id is unknown; ask per id which.
async function knownIds(ids) {
  const found = await Promise.all(
    ids.map((id) => api.getRun(id).then(() => true, (error) => (error.status === 404 ? false : Promise.reject(error)))),
  );
  return { known: ids.filter((_, i) => found[i]), unknown: ids.filter((_, i) => !found[i]) };
}

function reportUnknown(unknown, known) {
  const box = document.getElementById("unknown");
  box.hidden = unknown.length === 0;
  const rest = known.length ? " The other runs are compared below." : "";
  box.replaceChildren(
    `No run is stored with id${unknown.length > 1 ? "s" : ""} `,
    ...unknown.flatMap((id, i) => [i ? ", " : "", el("code", { class: "unknown-id", text: id })]),
    `.${rest}`,
  );
}

function hideResults() {
  document.getElementById("compare-table-card").hidden = true;
  for (const panel of Object.values(panels)) panel.element.hidden = true;
}

async function load(catalogue, runIds) {
  const m = (name) => metricOf(catalogue, name);
  const { runs, step_time_tests: tests } = await api.compareRuns(runIds);
  const names = labels(runs);
  const seriesList = await Promise.all(runs.map((run) => api.getSeries(run.run_id, { max_points: MAX_POINTS })));
  renderTable(catalogue, runs, names, tests);
  renderCharts(m, runs, names, seriesList);
  return runs.some((run) => run.status === "running");
}

// Keeps refreshing while any compared run is still running. A 404 means some id is unknown:
// those are named and the rest compared, instead of retrying the whole set forever.
async function loop(catalogue, runIds) {
  let running = false;
  try {
    running = await load(catalogue, runIds);
    showError(null);
  } catch (error) {
    if (error.status === 404) return compareKnown(catalogue, runIds);
    showError(error);
    running = true;
  }
  if (running) setTimeout(() => loop(catalogue, runIds), REFRESH_MS);
}

async function compareKnown(catalogue, runIds) {
  try {
    const { known, unknown } = await knownIds(runIds);
    reportUnknown(unknown, known);
    if (!known.length) return hideResults();
    return loop(catalogue, known);
  } catch (error) {
    showError(error);
  }
}

async function start() {
  if (!requestedIds.length) return hideResults();
  try {
    const catalogue = await loadCatalogue();
    renderDefinitions(catalogue, ROWS.map((row) => row.name));
    await loop(catalogue, requestedIds);
  } catch (error) {
    showError(error);
  }
}

start();
