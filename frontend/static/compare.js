// Compare page: side-by-side table and overlays of TFLOP/s and step time for the chosen runs.

import * as api from "./api.js";
import * as fmt from "./format.js";
import { ChartPanel, RUN_COLORS, fill, layout, line } from "./charts.js";
import { el, showError, statusBadge } from "./dom.js";

const runIds = JSON.parse(document.getElementById("compare").dataset.runIds);
const MAX_POINTS = 500;
const REFRESH_MS = 5000;

// delta: how a run differs from the first one — "rel" in percent, "pp" in percentage points.
const METRICS = [
  { key: "step_time_s", label: "Step time", format: fmt.seconds, delta: "rel" },
  { key: "tflops_thd", label: "THD-corrected TFLOP/s/GPU", format: fmt.num, delta: "rel", swatch: "thd" },
  { key: "tflops_bshd", label: "Baseline TFLOP/s/GPU", format: fmt.num, delta: "rel", swatch: "baseline" },
  // Useful work only (real tokens): what padded and packed runs should be judged by.
  { key: "tflops_useful", label: "Useful TFLOP/s/GPU", format: fmt.num, delta: "rel", swatch: "useful" },
  { key: "overcount_pct", label: "Over-count", format: fmt.pct, delta: "pp" },
  { key: "mfu_thd", label: "MFU (THD)", format: fmt.fraction, delta: "pp", scale: 100 },
  { key: "tokens_per_s", label: "Tokens/s", format: fmt.si, delta: "rel" },
  { key: "padding_pct", label: "Padding", format: fmt.pct, delta: "pp" },
  { key: "syncs_per_iter", label: "Syncs/iter", format: fmt.num, delta: "rel" },
  { key: "steps", label: "Steps", format: fmt.int },
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

function delta(metric, value, reference) {
  if (!metric.delta || value === null || value === undefined || !reference) return null;
  const change = metric.delta === "pp" ? (value - reference) * (metric.scale || 1) : (100 * (value - reference)) / reference;
  return el("div", { class: "delta muted small", text: fmt.signed(change, metric.delta === "pp" ? "pp" : "%") });
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

function renderTable(runs, names, tests) {
  const head = el("thead", {}, el("tr", {}, [
    el("th", { text: "" }),
    ...runs.map((run, i) =>
      el("th", { class: "num" }, [
        el("span", { class: "run-swatch", style: `background:${RUN_COLORS[i % RUN_COLORS.length]}` }),
        el("a", { href: api.runPageUrl(run.run_id), text: names[i] }),
        el("div", { class: "muted small" }, [`${run.layout} · `, statusBadge(run.status)]),
      ]),
    ),
  ]));
  const reference = runs[0].totals || {};
  const rows = METRICS.map((metric) =>
    el("tr", {}, [
      el("th", { scope: "row" }, [metric.swatch ? el("span", { class: `swatch ${metric.swatch}` }) : null, metric.label]),
      ...runs.map((run, i) => {
        const value = run.totals ? run.totals[metric.key] : null;
        return el("td", { class: "num" }, [
          el("div", { text: metric.format(value) }),
          i > 0 ? delta(metric, value, reference[metric.key]) : null,
        ]);
      }),
    ]),
  );
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

function renderCharts(runs, names, seriesList) {
  const tflops = [];
  const stepTime = [];
  runs.forEach((run, i) => {
    const series = seriesList[i];
    if (!series.points) return;
    const color = RUN_COLORS[i % RUN_COLORS.length];
    const thd = line("tflops_thd", "", color, { unit: " TFLOP/s" });
    const bshd = line("tflops_bshd", "", color, { dash: "dash", unit: " TFLOP/s", width: 1.5 });
    const step = line("step_time_s", "", color, { unit: " s" });
    tflops.push(
      ...fill([named(thd, `${names[i]} · THD`, `${names[i]}:tflops_thd`), named(bshd, `${names[i]} · baseline`, `${names[i]}:tflops_bshd`)], series.columns),
    );
    stepTime.push(...fill([named(step, names[i], `${names[i]}:step_time_s`)], series.columns));
  });
  if (!tflops.length) {
    panels.tflops.showEmpty("Waiting for the first interval…");
    panels.step_time.showEmpty("Waiting for the first interval…");
    return;
  }
  panels.tflops.draw(tflops, layout({ yTitle: "TFLOP/s per GPU" }));
  panels.step_time.draw(stepTime, layout({ yTitle: "seconds per step", ySuffix: " s" }));
}

async function load() {
  const { runs, step_time_tests: tests } = await api.compareRuns(runIds);
  const names = labels(runs);
  const seriesList = await Promise.all(runs.map((run) => api.getSeries(run.run_id, { max_points: MAX_POINTS })));
  renderTable(runs, names, tests);
  renderCharts(runs, names, seriesList);
  return runs.some((run) => run.status === "running");
}

// Keeps refreshing while any compared run is still running.
async function loop() {
  let running = false;
  try {
    running = await load();
    showError(null);
  } catch (error) {
    showError(error);
    running = true;
  }
  if (running) setTimeout(loop, REFRESH_MS);
}

if (runIds.length) loop();
else {
  document.getElementById("compare-table-card").hidden = true;
  for (const panel of Object.values(panels)) panel.element.hidden = true;
}
