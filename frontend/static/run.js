// Run page: totals, series charts, histograms and sync sites; live through SSE.

import * as api from "./api.js";
import * as fmt from "./format.js";
import { COLORS, ChartPanel, band, fill, layout, line } from "./charts.js";
import { histogramTraces } from "./histogram.js";
import { el, showError } from "./dom.js";

const runId = document.getElementById("run").dataset.runId;
const MAX_POINTS = 500;
// Extending forever would grow the traces without bound; past this, fetch a re-downsampled series.
const REDRAW_POINTS = 3 * MAX_POINTS;
const WAITING = "Waiting for the first interval…";

const pctLine = { unit: " %" };

// THD-corrected is drawn last so it stays visible where useful nearly coincides with it;
// legendrank keeps the legend in reading order regardless.
function threeCounts(prefix, suffix, options) {
  return [
    line(`${prefix}_useful${suffix}`, "useful", COLORS.useful, { ...options, dash: "dot", rank: 3 }),
    line(`${prefix}_bshd${suffix}`, "baseline", COLORS.baseline, { ...options, rank: 1 }),
    line(`${prefix}_thd${suffix}`, "THD-corrected", COLORS.thd, { ...options, rank: 2, width: 2.5 }),
  ];
}

const SERIES_CHARTS = {
  tflops: {
    traces: () => [
      ...band("tflops_useful", "useful", COLORS.useful),
      ...band("tflops_bshd", "baseline", COLORS.baseline),
      ...band("tflops_thd", "THD-corrected", COLORS.thd),
      ...threeCounts("tflops", "", { unit: " TFLOP/s" }),
    ],
    layout: layout({ yTitle: "TFLOP/s per GPU" }),
  },
  overcount: {
    traces: () => [line("overcount_pct", "over-count", COLORS.overcount, pctLine)],
    layout: { ...layout({ yTitle: "over-count", ySuffix: " %" }), showlegend: false },
  },
  mfu: {
    unavailable: (state) => !state.peak && "MFU needs the GPU's peak TFLOP/s, which this run did not report.",
    traces: () => threeCounts("mfu", "_pct", pctLine),
    layout: layout({ yTitle: "MFU", ySuffix: " %" }),
  },
  step_time: {
    traces: () => [
      ...band("step_time_s", "step time", COLORS.neutral),
      line("step_time_s", "step time", COLORS.neutral, { unit: " s" }),
    ],
    layout: { ...layout({ yTitle: "seconds per step", ySuffix: " s" }), showlegend: false },
  },
  tokens: {
    traces: () => [line("tokens_per_s", "tokens/s", COLORS.neutral, { hoverFormat: ".3s", unit: " tokens/s" })],
    layout: { ...layout({ yTitle: "tokens/s", yFormat: "~s" }), showlegend: false },
  },
  syncs: {
    traces: () => [line("syncs_per_iter", "syncs/iter", COLORS.overcount)],
    layout: { ...layout({ yTitle: "syncs per iteration" }), showlegend: false },
  },
  padding: {
    traces: () => [line("padding_pct", "padding", COLORS.neutral, pctLine)],
    layout: { ...layout({ yTitle: "padding", ySuffix: " %" }), showlegend: false },
  },
  loss: {
    emptyMessage: "This run has not reported a loss.",
    traces: () => [line("loss", "loss", COLORS.neutral, { hoverFormat: ".4r" })],
    layout: { ...layout({ yTitle: "loss", fromZero: false }), showlegend: false },
  },
};

const STATS = {
  tflops_thd: fmt.num,
  tflops_bshd: fmt.num,
  tflops_useful: fmt.num,
  overcount_pct: fmt.pct,
  mfu_thd: fmt.fraction,
  step_time_s: fmt.seconds,
  tokens_per_s: fmt.si,
  padding_pct: fmt.pct,
  syncs_per_iter: fmt.num,
  steps: fmt.int,
};

const panels = {};
for (const id of [...Object.keys(SERIES_CHARTS), "histogram"]) {
  panels[id] = new ChartPanel(document.getElementById(`chart-${id}`), {
    filename: `${runId}-${id}.csv`,
    xName: id === "histogram" ? "length_bucket" : "step",
  });
}

const state = { peak: null, columns: null, points: 0, lastStep: null };

// MFU per count, in percent, from the same peak the server uses.
function derive(columns) {
  if (state.peak) {
    for (const count of ["bshd", "thd", "useful"]) {
      columns[`mfu_${count}_pct`] = columns[`tflops_${count}`].map((v) => (v === null ? null : (100 * v) / state.peak));
    }
  }
  return columns;
}

const lineColumns = (traces) => traces.filter((t) => t.meta.kind === "line").map((t) => t.meta.column);
const hasData = (traces, columns) =>
  state.points > 0 && lineColumns(traces).some((c) => columns[c].some((v) => v !== null));

function drawSeries() {
  for (const [id, spec] of Object.entries(SERIES_CHARTS)) {
    const reason = spec.unavailable?.(state);
    const traces = spec.traces();
    if (reason) panels[id].showEmpty(reason);
    else if (!hasData(traces, state.columns)) panels[id].showEmpty(state.points ? spec.emptyMessage ?? WAITING : WAITING);
    else panels[id].draw(fill(traces, state.columns), spec.layout);
  }
}

function extendSeries(fresh) {
  for (const [id, spec] of Object.entries(SERIES_CHARTS)) {
    if (panels[id].drawn) panels[id].extend(fresh);
    else if (!spec.unavailable?.(state) && hasData(spec.traces(), state.columns)) {
      panels[id].draw(fill(spec.traces(), state.columns), spec.layout);
    }
  }
}

function remember(series) {
  state.columns = derive(series.columns);
  state.points = series.points;
  state.lastStep = series.points ? series.columns.step.at(-1) : null;
}

async function loadSeries() {
  remember(await api.getSeries(runId, { max_points: MAX_POINTS }));
  drawSeries();
}

async function extendWithNewIntervals() {
  if (state.lastStep === null || state.points > REDRAW_POINTS) return loadSeries();
  const series = await api.getSeries(runId, { max_points: MAX_POINTS, step_min: state.lastStep + 1 });
  if (!series.points) return;
  const fresh = derive(series.columns);
  for (const [name, values] of Object.entries(fresh)) state.columns[name]?.push(...values);
  state.points += series.points;
  state.lastStep = fresh.step.at(-1);
  extendSeries(fresh);
}

function renderTotals(run) {
  state.peak = run.hardware?.peak_tflops || null;
  for (const node of document.querySelectorAll("[data-stat]")) {
    const key = node.dataset.stat;
    node.querySelector(".value").textContent = STATS[key](run.totals ? run.totals[key] : null);
  }
  const badge = document.getElementById("run-status");
  badge.textContent = run.status;
  badge.className = `badge status-${run.status}`;
}

async function loadHistogram(run) {
  if (!run.intervals) return panels.histogram.showEmpty(WAITING);
  const histogram = await api.getHistograms(runId);
  const traces = histogramTraces(histogram);
  if (!traces.length) return panels.histogram.showEmpty("The latest interval has no lengths recorded.");
  const steps = `interval ${histogram.interval}, steps ${histogram.first_step}–${histogram.last_step}`;
  panels.histogram.draw(traces, {
    ...layout({ yTitle: "tokens", xTitle: `length (tokens) · ${steps}`, yFormat: "~s", barmode: "group", xType: "category" }),
    hovermode: "closest",
  });
}

async function loadSyncSites(run) {
  const body = document.getElementById("sync-sites-body");
  if (!run.intervals) return;
  const { sites } = await api.getSyncSites(runId);
  const rows = sites.map((site) =>
    el("tr", {}, [
      el("td", {}, el("code", { text: site.site })),
      el("td", { class: "num", text: fmt.int(site.count) }),
      el("td", { class: "num", text: fmt.num(site.per_iter) }),
    ]),
  );
  body.replaceChildren(...(rows.length ? rows : [el("tr", { class: "placeholder" }, el("td", { colspan: 3, text: "No host syncs recorded." }))]));
}

async function refreshSummary() {
  const run = await api.getRun(runId);
  renderTotals(run);
  await Promise.all([loadHistogram(run), loadSyncSites(run)]);
}

// Coalesces bursts of SSE events: at most one refresh runs, and at most one waits behind it.
let queued = false;
let chain = Promise.resolve();
function scheduleRefresh() {
  if (queued) return;
  queued = true;
  chain = chain.then(async () => {
    queued = false;
    try {
      await refreshSummary();
      await extendWithNewIntervals();
      showError(null);
    } catch (error) {
      showError(error);
    }
  });
}

function listen() {
  const live = document.getElementById("live");
  const source = new EventSource(api.streamUrl(runId));
  const show = (mode, text) => Object.assign(live, { textContent: text, className: `live ${mode}` });
  source.addEventListener("open", () => show("on", "● live"));
  source.addEventListener("error", () => show("off", "reconnecting…"));
  source.addEventListener("interval", scheduleRefresh);
}

async function start() {
  try {
    const run = await api.getRun(runId);
    renderTotals(run);
    await Promise.all([loadSeries(), loadHistogram(run), loadSyncSites(run)]);
  } catch (error) {
    showError(error);
  }
  listen();
}

start();
