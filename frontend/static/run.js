// @ts-check
// Run page: totals, series charts, histograms, sync sites and the system panel; live through SSE.
// The series charts follow the controls bar (x axis, log y, smoothing; controls.js).
// Every number is the server's (series and totals carry each catalogue metric); this page only
// picks which to show and formats them as the catalogue says.

import * as api from "./api.js";
import { loadCatalogue, metricOf } from "./catalogue.js";
import { COLORS, channelColor } from "./colors.js";
import { count, display, formatNumber } from "./format.js";
import { ChartPanel, band, fill, layout, line } from "./charts.js";
import { appendColumns, channelColumns, channelMetric, channelOf, isChannel } from "./channels.js";
import { X_AXES, readSettings, renderControls, xColumns } from "./controls.js";
import { carriedParts } from "./extension.js";
import { metricLabel, renderDefinitions } from "./definitions.js";
import { el, showError } from "./dom.js";
import { LengthsPanel } from "./lengths.js";
import { showRunLedger } from "./ledger_run.js";
import { RanksPanel } from "./ranks.js";
import { painted, plotlyLoaded } from "./run_early.js";
import { baselineText, contactText, crossDocumentsText, emptyText, flopsSplitText, LIVE, refusalText, windows, windowsNote } from "./run_facts.js";
import { HEADLINE, headlineChart, threeCounts } from "./run_headline.js";
import { SERIES_POINTS as MAX_POINTS } from "./run_sizes.js";

const runId = document.getElementById("run").dataset.runId;
// Extending forever would grow the traces without bound; past this, fetch a re-downsampled series.
const REDRAW_POINTS = 3 * MAX_POINTS;
// A run's end arrives by PATCH, which the stream does not announce; ask now and then while live.
const STATUS_POLL_MS = 10_000;
// While events arrive, the tiles, panels and other charts are refreshed at most this often: each
// refresh is several requests and a plotly pass per chart, which must not hold back the headline
// chart's next points (the last event's refresh always follows it).
const REST_EVERY_MS = 2_000;
const SYSTEM_METRICS = ["gpu_util_pct", "gpu_power_w", "energy_per_token_j", "gpu_mem_used_bytes", "gpu_sm_clock_mhz"];
// Charts of catalogue metrics that a server may not have yet: drawn once the catalogue lists them.
const OPTIONAL_CHARTS = { gpu_mem: "gpu_mem_used_bytes", gpu_clock: "gpu_sm_clock_mhz" };
const STEP_QUANTILES = [
  ["step_time_p50_s", "median step (p50)", "dot"],
  ["step_time_p90_s", "p90 step", "dash"],
];

const single = (m, name, color, options) => [line(name, m(name), color, options)];
const withBand = (m, name, color) => [...band(name, m(name).label, color), line(name, m(name), color)];
const alone = (plotLayout) => ({ ...plotLayout, showlegend: false });

// The step-time chart: Σ GPU time ÷ Σ steps with its band, and the step-weighted quantiles once
// the catalogue has them.
function stepTimeTraces(m, has) {
  const quantiles = STEP_QUANTILES.filter(([name]) => has(name)).map(([name, label, dash]) =>
    line(name, m(name), COLORS.neutral, { name: label, dash, width: 1.5 }),
  );
  return [...withBand(m, "step_time_s", COLORS.neutral), ...quantiles];
}

// m: metric name -> catalogue entry; has: whether the catalogue lists a metric.
function seriesCharts(m, has) {
  const optional = Object.fromEntries(
    Object.entries(OPTIONAL_CHARTS)
      .filter(([, name]) => has(name))
      .map(([id, name]) => [id, { system: true, traces: single(m, name, COLORS.system), layout: alone(layout({ yTitle: m(name).label, metric: m(name) })) }]),
  );
  const stepTime = stepTimeTraces(m, has);
  return {
    [HEADLINE]: headlineChart(m),
    overcount: {
      traces: single(m, "overcount_pct", COLORS.overcount),
      layout: alone(layout({ yTitle: m("overcount_pct").label, metric: m("overcount_pct") })),
    },
    mfu: {
      unavailable: (run) => !run.hardware?.peak_tflops && "MFU needs the GPU's peak TFLOP/s, which this run did not report.",
      traces: threeCounts(m, "mfu"),
      layout: layout({ yTitle: "MFU", metric: m("mfu_useful") }),
    },
    step_time: {
      traces: stepTime,
      layout: stepTime.length > 3 ? layout({ yTitle: "seconds per step", metric: m("step_time_s") }) : alone(layout({ yTitle: "seconds per step", metric: m("step_time_s") })),
    },
    tokens: {
      traces: [
        line("tokens_per_gpu_s", m("tokens_per_gpu_s"), COLORS.neutral, { dash: "dash", rank: 2 }),
        line("real_tokens_per_gpu_s", m("real_tokens_per_gpu_s"), COLORS.useful, { rank: 1 }),
      ],
      layout: layout({ yTitle: "tokens/s", metric: m("real_tokens_per_gpu_s") }),
    },
    syncs: { traces: single(m, "syncs_per_iter", COLORS.overcount, { markers: true }), layout: alone(layout({ yTitle: "syncs per iteration", metric: m("syncs_per_iter") })) },
    padding: { traces: single(m, "padding_pct", COLORS.neutral), layout: alone(layout({ yTitle: "padding", metric: m("padding_pct") })) },
    loss: {
      emptyMessage: "This run has not reported a loss.",
      traces: single(m, "loss", COLORS.neutral),
      layout: alone(layout({ yTitle: "loss", metric: m("loss"), fromZero: false })),
    },
    lr: {
      emptyMessage: "This run has not reported a learning rate (step_end's lr, docs/agent.md).",
      traces: single(m, "lr", COLORS.neutral),
      layout: alone(layout({ yTitle: "learning rate", metric: m("lr") })),
    },
    grad_norm: {
      emptyMessage: "This run has not reported a gradient norm (step_end's grad_norm, docs/agent.md).",
      traces: single(m, "grad_norm", COLORS.neutral),
      layout: alone(layout({ yTitle: "gradient norm", metric: m("grad_norm") })),
    },
    // One line per channel, set from the series (channelTraces): the channels are the run's own.
    channels: {
      emptyMessage: "This run reported no per-channel loss (step_end's channel_loss, docs/agent.md).",
      traces: [],
      layout: layout({ yTitle: "loss", metric: m("loss"), fromZero: false }),
    },
    gpu_util: { system: true, traces: single(m, "gpu_util_pct", COLORS.system), layout: alone(layout({ yTitle: "utilisation", metric: m("gpu_util_pct") })) },
    gpu_power: { system: true, traces: single(m, "gpu_power_w", COLORS.system), layout: alone(layout({ yTitle: "power", metric: m("gpu_power_w") })) },
    energy: { system: true, traces: single(m, "energy_per_token_j", COLORS.system), layout: alone(layout({ yTitle: "J per real token", metric: m("energy_per_token_j") })) },
    ...optional,
  };
}

// series: which series `columns` holds, counted up each time it is fetched whole (a chart drawn
// from another one cannot be extended from this one).
const state = { run: null, charts: null, columns: null, points: 0, lastStep: null, loss: null, series: 0 };
const settings = readSettings();
const panels = {};

const lineColumns = (traces) => traces.filter((t) => t.meta.kind === "line").map((t) => t.meta.column);
const anyValue = (columns, names) => names.some((name) => columns?.[name]?.some((v) => v !== null));
const hasData = (traces) => state.points > 0 && anyValue(state.columns, lineColumns(traces));

// The system panel shows once the run has NVML readings (totals or series); it stays hidden otherwise.
function systemShown() {
  const shown = SYSTEM_METRICS.some((name) => state.run?.totals?.[name] != null) || anyValue(state.columns, SYSTEM_METRICS);
  document.getElementById("system").hidden = !shown;
  return shown;
}

function emptyReason(spec) {
  if (spec.unavailable?.(state.run)) return spec.unavailable(state.run);
  if (!hasData(spec.traces)) return state.points ? spec.emptyMessage ?? emptyText(state.run) : emptyText(state.run);
  return null;
}

// Series charts out of view are not drawn on a live event: each drawing is a whole plotly pass,
// and a dozen of them outlast the gap between events. One that comes into view is brought up to
// date then (observeCharts). The headline chart is the exception: it takes each event at once even
// below the fold (the ledger above it pushes it there at 900 px), one extension an interval.
const inView = new Set();
const behind = new Set();

// which(id): whether to draw that chart this time (all of them unless told). live: the columns
// grew by new intervals; a drawn chart then takes only the new points (ChartPanel.extend) and one
// out of view waits until it is seen.
/** @param {(id: string) => boolean} [which] */
function drawSeries(which = () => true, live = false) {
  const system = systemShown();
  for (const [id, spec] of Object.entries(state.charts)) {
    if (!which(id)) continue;
    if (spec.system && !system) continue; // a hidden plot has no size to draw into
    if (live && id !== HEADLINE && !inView.has(id)) {
      behind.add(id);
      continue;
    }
    behind.delete(id);
    const reason = emptyReason(spec);
    if (reason) panels[id].showEmpty(reason);
    else if (!(live && panels[id].extend(spec.traces, spec.layout, settings, state.series, state.columns))) {
      panels[id].draw(fill(spec.traces, state.columns, X_AXES[settings.x].column), spec.layout, settings, state.series);
    }
  }
}

// The lengths and ranks panels (plotly charts too, a request and a drawing or two each) likewise:
// a live refresh passes over one out of view, which is brought up to date once it is seen. A
// hidden one is refreshed, so that it can show itself (the ranks once a second rank reports).
const PANEL_CHARTS = { lengths: ["chart-histogram", "chart-length_heatmap"], ranks: ["ranks"] };
const panelsInView = new Set(); // element ids
const panelsBehind = new Set();

function refreshPanel(name, run, live = true) {
  const ids = PANEL_CHARTS[name];
  const seen = ids.some((id) => panelsInView.has(id) || document.getElementById(id).hidden);
  if (live && !seen) {
    panelsBehind.add(name);
    return Promise.resolve();
  }
  panelsBehind.delete(name);
  return name === "lengths" ? lengthsPanel.load(run) : ranksPanel.load(run);
}

function observeCharts() {
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      const target = /** @type {HTMLElement} */ (entry.target);
      const id = target.dataset.series;
      if (id === undefined) {
        if (!entry.isIntersecting) panelsInView.delete(target.id);
        else {
          panelsInView.add(target.id);
          const name = Object.keys(PANEL_CHARTS).find((key) => PANEL_CHARTS[key].includes(target.id));
          if (panelsBehind.has(name) && state.run) refreshPanel(name, state.run, false).catch(showError);
        }
      } else if (!entry.isIntersecting) inView.delete(id);
      else {
        inView.add(id);
        if (behind.has(id)) drawSeries((other) => other === id, true);
      }
    }
  });
  for (const [id, panel] of Object.entries(panels)) {
    panel.element.dataset.series = id;
    observer.observe(panel.element);
  }
  for (const id of Object.values(PANEL_CHARTS).flat()) observer.observe(document.getElementById(id));
}

// The channel chart's lines, one per channel column held, coloured in the channels' sorted order.
function channelTraces(loss) {
  const names = Object.keys(state.columns).filter(isChannel).sort();
  return names.map((column, i) => line(column, channelMetric(loss, column), channelColor(i), { name: channelOf(column) }));
}

function remember(series) {
  state.series += 1;
  state.columns = { ...series.columns, ...xColumns(series), ...channelColumns(series) };
  state.points = series.points;
  state.lastStep = series.points ? series.columns.step.at(-1) : null;
  state.charts.channels.traces = channelTraces(state.loss);
}

// The first load draws the headline chart in a frame of its own: plotly's chart takes over from
// the first drawing (run_early.js) before the other charts, each about as long, take their turn.
async function loadHeadline() {
  remember(await api.getSeries(runId, { max_points: MAX_POINTS }));
  drawSeries((id) => id === HEADLINE);
  performance.mark("headline-plotted"); // read by bench/browser_timing.py
  await painted();
}

// Appends a part of the series that continues the held one (its step_min past state.lastStep).
function appendSeries(series) {
  const fresh = { ...series.columns, ...xColumns(series, state.columns.tokens_seen.at(-1)), ...channelColumns(series) };
  appendColumns(state.columns, state.points, fresh, series.points);
  state.points += series.points;
  state.lastStep = series.columns.step.at(-1);
}

// The stream's events not taken yet, in the order they came (null: one that could not be read).
/** @type {(import("./extension.js").LiveEvent | null)[]} */
const arrived = [];

// A live refresh draws the headline chart alone, with the new part of the series as the events
// carried it (no request), or as fetched where they do not.
async function extendWithNewIntervals() {
  const events = arrived.splice(0);
  if (state.lastStep === null || state.points > REDRAW_POINTS) {
    remember(await api.getSeries(runId, { max_points: MAX_POINTS }));
  } else {
    const parts = carriedParts(events, state.lastStep) ?? [await api.getSeries(runId, { max_points: MAX_POINTS, step_min: state.lastStep + 1 })];
    const grown = parts.filter((series) => series.points);
    if (!grown.length) return;
    for (const series of grown) appendSeries(series);
    state.charts.channels.traces = channelTraces(state.loss);
  }
  drawSeries((id) => id === HEADLINE, true);
  await painted();
}

function labelStats(catalogue) {
  for (const node of /** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll("[data-stat]"))) {
    node.querySelector(".label").replaceChildren(metricLabel(metricOf(catalogue, node.dataset.stat)));
  }
}

// Each tile says which steps it covers: a rate leaves the warm-up interval out, an amount does not.
function renderTotals(catalogue, run) {
  state.run = run;
  const shown = api.shownTotals(run, catalogue);
  const covered = windows(run);
  for (const node of /** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll("[data-stat]"))) {
    const metric = metricOf(catalogue, node.dataset.stat);
    node.querySelector(".value").textContent = display(metric, shown[metric.name]);
    let window = node.querySelector(".window");
    if (!window) node.append((window = el("span", { class: "window muted small" })));
    window.textContent = covered ? (metric.amount ? covered.amounts : covered.rates) : "";
  }
  document.getElementById("flops-split").textContent = flopsSplitText(shown, catalogue);
  const badge = document.getElementById("run-status");
  badge.textContent = run.status;
  badge.className = `badge status-${run.status}`;
  renderFacts(run);
}

// The lines around the tiles: their windows, the baseline's pack, the layout, refused intervals.
function renderFacts(run) {
  const note = windowsNote(run);
  if (note) document.getElementById("warmup-note").textContent = `${note} The charts show every interval.`;
  document.getElementById("baseline-note").textContent = baselineText(run);
  const declared = run.layout !== run.layout_declared ? ` (as its batches were; declared ${run.layout_declared})` : "";
  document.getElementById("run-layout").textContent = `layout ${run.layout}${declared}`;
  const refused = document.getElementById("refused");
  refused.hidden = !run.refused;
  refused.textContent = run.refused ? `${refusalText(run)}.${run.records ? "" : " Nothing else was stored."}` : "";
  const cross = crossDocumentsText(run);
  const warning = document.getElementById("cross-documents");
  warning.hidden = !cross?.warn;
  warning.textContent = cross?.warn ? cross.text : "";
  document.getElementById("cross-documents-note").textContent = cross && !cross.warn ? cross.text : "";
}

// A sync site is "path:line in function" (agent/sync_sites.py): a long one shows its tail, where
// the file, the line and the function are, and the whole in its title.
const SITE_SHOWN = 80;
const siteText = (site) => (site.length <= SITE_SHOWN ? site : `…${site.slice(1 - SITE_SHOWN)}`);

// Over the steps of the syncs/iteration tile (window=steady), so table and tile agree.
async function loadSyncSites(catalogue, run) {
  const body = document.getElementById("sync-sites-body");
  if (!run.records) {
    const text = emptyText(run);
    body.replaceChildren(el("tr", { class: "placeholder" }, el("td", { colspan: 3, text })));
    return;
  }
  const perIter = metricOf(catalogue, "syncs_per_iter");
  const { sites, window, first_step: first, last_step: last, counted_share: share } = await api.getSyncSites(runId, 10, "steady");
  const steps = first === last ? `step ${count(first)}` : `steps ${count(first)}–${count(last)}`;
  const why = window === "steady" ? ", as the tiles: the first interval (warm-up) left out" : ", the whole run";
  // The agent counts syncs over one interval in a few (count_syncs_every): say over how many.
  const sampled = share !== null && share < 1 ? `; syncs counted on ${formatNumber(".0%", share)} of them (the agent samples intervals)` : "";
  document.getElementById("sync-sites-note").textContent = `${steps}${why}${sampled}`;
  const rows = sites.map((site) =>
    el("tr", {}, [
      el("td", {}, el("code", { text: siteText(site.site), title: site.site })),
      el("td", { class: "num", text: count(site.count) }),
      el("td", { class: "num", text: formatNumber(perIter.format, site.per_iter) }),
    ]),
  );
  const none = share === 0 ? "No syncs counted: the agent counted none of these steps." : "No host syncs recorded.";
  body.replaceChildren(...(rows.length ? rows : [el("tr", { class: "placeholder" }, el("td", { colspan: 3, text: none }))]));
}

function parsed(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

// "● live" only while the run is running and the stream is open. A stale run (its agent missed
// heartbeats) keeps its stream but says since when it is silent; a crashed one is only polled, so
// that a resumed run comes back; a finished or failed run closes both, so the badge cannot outlive it.
const live = {
  source: null,
  poll: null,
  status: null,
  badge: document.getElementById("live"),
  show(mode, text) {
    Object.assign(this.badge, { textContent: text, className: `muted live ${mode}` });
  },
  follow(run) {
    this.status = run.status;
    const streamed = run.status === "running" || run.status === "stale";
    if (streamed && !this.source) this.open();
    else if (!streamed && this.source) this.closeStream();
    if (LIVE.has(run.status) && !this.poll) {
      this.poll = setInterval(() => document.hidden || scheduleRefresh(), STATUS_POLL_MS);
    } else if (!LIVE.has(run.status) && this.poll) {
      clearInterval(this.poll);
      this.poll = null;
    }
    if (run.status === "running") this.show("on", this.source?.readyState === EventSource.OPEN ? "● live" : "connecting…");
    else if (LIVE.has(run.status)) this.show("silent", `no contact since ${contactText(run.last_contact_at)}`);
    else this.show("off", "");
  },
  open() {
    this.source = new EventSource(api.streamUrl(runId));
    this.source.addEventListener("open", () => this.status === "running" && this.show("on", "● live"));
    this.source.addEventListener("error", () => this.status === "running" && this.show("off", "reconnecting…"));
    this.source.addEventListener("interval", (/** @type {MessageEvent} */ message) => {
      arrived.push(parsed(message.data));
      scheduleRefresh();
    });
  },
  closeStream() {
    this.source.close();
    this.source = null;
  },
};

let catalogue = null;
let ranksPanel = null;
let lengthsPanel = null;

async function refreshSummary() {
  const run = await api.getRun(runId);
  renderTotals(catalogue, run);
  live.follow(run);
  await headlineLane.idle(); // the panels' requests and drawings after a headline refresh begun meanwhile
  await Promise.all([refreshPanel("lengths", run), loadSyncSites(catalogue, run), refreshPanel("ranks", run), showRunLedger(runId, plotlyLoaded)]);
}

// Coalesces bursts of SSE events: at most one run of `work` at a time, and at most one waiting
// behind it; `idle()` resolves once the runs asked for so far are done.
function coalesced(work) {
  let queued = false;
  let chain = Promise.resolve();
  return {
    schedule() {
      if (queued) return;
      queued = true;
      chain = chain.then(async () => {
        queued = false;
        try {
          await work();
          showError(null);
        } catch (error) {
          showError(error);
        }
      });
    },
    idle: () => chain,
  };
}

// Two lanes, so that the new interval's points (what a person watches for) never wait behind the
// slower rest of a refresh: the headline chart's, and the summary's with the other charts. The
// rest begins once the headline has its new points, and draws one chart a frame, so that the next
// interval's headline can be drawn in between.
const headlineLane = coalesced(extendWithNewIntervals);
let restBegan = -Infinity;
const restLane = coalesced(async () => {
  await new Promise((resolve) => setTimeout(resolve, restBegan + REST_EVERY_MS - performance.now()));
  await headlineLane.idle();
  restBegan = performance.now();
  await refreshSummary();
  for (const id of Object.keys(state.charts)) {
    if (id === HEADLINE) continue;
    // A headline refresh that an event started meanwhile goes first, fetch and drawing.
    await headlineLane.idle();
    drawSeries((other) => other === id, true);
    await painted();
  }
});
function scheduleRefresh() {
  headlineLane.schedule();
  restLane.schedule();
}

async function start() {
  try {
    const [loaded, run] = await Promise.all([loadCatalogue(), api.getRun(runId)]);
    catalogue = loaded;
    const m = (name) => metricOf(catalogue, name);
    state.charts = seriesCharts(m, (name) => catalogue.has(name));
    state.loss = m("loss");
    for (const [id, name] of Object.entries(OPTIONAL_CHARTS)) document.getElementById(`chart-${id}`).hidden = !catalogue.has(name);
    for (const id of Object.keys(state.charts)) {
      panels[id] = new ChartPanel(document.getElementById(`chart-${id}`), { filename: `${runId}-${id}.csv` });
    }
    lengthsPanel = new LengthsPanel(runId);
    renderControls(document.getElementById("chart-controls"), settings, () => state.columns && drawSeries());
    labelStats(catalogue);
    const shown = [.../** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll("[data-stat]"))].map((node) => node.dataset.stat);
    renderDefinitions(catalogue, [...shown, "tflops_bshd", "tflops_thd", "tflops_useful", "mfu_bshd", "mfu_thd", "tokens_per_gpu_s"]);
    renderTotals(catalogue, run);
    ranksPanel = new RanksPanel(runId, m("step_time_s"));
    await plotlyLoaded; // after run_early.js's first drawing of the headline chart
    await loadHeadline();
    // The requests go out first; the other series charts are drawn while they are answered.
    const loads = [showRunLedger(runId, plotlyLoaded), loadSyncSites(catalogue, run), ranksPanel.load(run), lengthsPanel.load(run)];
    drawSeries((id) => id !== HEADLINE);
    observeCharts();
    await Promise.all(loads);
  } catch (error) {
    showError(error);
  }
  api.forgetEarly();
  // Listening starts after the first load: the stream's first event would only repeat it.
  if (state.run) live.follow(state.run);
}

start();
