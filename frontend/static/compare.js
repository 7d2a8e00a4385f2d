// @ts-check
// Compare page: side-by-side table (a column per run up to 4 runs, a row per run beyond, so a dozen
// fit the window), how the runs' settings differ, overlays of any catalogue metric the user picks
// (kept in the URL as metric=…) and of TFLOP/s (useful, per-document or both: measure=) and step
// time, for the chosen runs, under one run key in place of the charts' legends; every chart
// follows the controls bar (controls.js). Runs can be grouped (group=, a config key, tag,
// project or layout): the charts then draw each group's mean with its min–max band. Ids the
// server does not know are named, and the rest are compared.

import * as api from "./api.js";
import { loadCatalogue, metricOf } from "./catalogue.js";
import { runColor } from "./colors.js";
import { showCompareLedgers } from "./compare_ledger.js";
import { display, signed } from "./format.js";
import { ChartPanel, band, fill, layout, line } from "./charts.js";
import { channelColumns, channelMetric, isChannel } from "./channels.js";
import { X_AXES, readSettings, renderControls, updateQuery, xColumns } from "./controls.js";
import { metricLabel, renderDefinitions } from "./definitions.js";
import { el, showError } from "./dom.js";
import { flatKeys, groupSeries, groupsOf, keyLabel } from "./groups.js";
import { statusCell, windows } from "./run_facts.js";

const requestedIds = JSON.parse(document.getElementById("compare").dataset.runIds);
const MAX_POINTS = 500;
const REFRESH_MS = 5000;
const COLUMNS_UP_TO = 4; // runs shown as table columns; more runs are table rows
const MAX_DIFF_ROWS = 200;
const GROUP_KEYS = ["tag", "project", "layout"];

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

// The series metrics an overlay may show; the first is shown when the URL names none. The
// per-channel losses of the compared runs ("channel_loss:<channel>") join them once loaded.
const OVERLAY_METRICS = [
  "real_tokens_per_gpu_s",
  "tflops_useful",
  "tflops_thd",
  "tflops_bshd",
  "mfu_useful",
  "mfu_thd",
  "mfu_bshd",
  "overcount_pct",
  "step_time_s",
  "tokens_per_gpu_s",
  "padding_pct",
  "syncs_per_iter",
  "loss",
  "lr",
  "grad_norm",
];
const WAITING = "Waiting for the first interval…";

const panels = {
  tflops: new ChartPanel(document.getElementById("chart-tflops"), { filename: "compare-tflops.csv" }),
  step_time: new ChartPanel(document.getElementById("chart-step_time"), { filename: "compare-step-time.csv" }),
};
const settings = readSettings();
// The last data loaded, so a control or an overlay's metric redraws without fetching again.
let shown = null;

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

// A run's head: its swatch, link, layout, status and the steps its rates cover.
function runHead(run, name, i) {
  const covered = windows(run);
  return [
    el("span", { class: "run-swatch", style: `background:${runColor(i)}` }),
    el("a", { href: api.runPageUrl(run.run_id), text: name, title: run.run_id }),
    el("div", { class: "muted small" }, [`${run.layout} · `, ...statusCell(run)]),
    covered ? el("div", { class: "muted small window", text: `rates: ${covered.rates}` }) : null,
  ];
}

function valueCell(catalogue, row, run, i, reference) {
  const metric = metricOf(catalogue, row.name);
  const value = api.shownTotals(run, catalogue)[row.name] ?? null;
  return el("td", { class: "num" }, [
    el("div", { class: "value", text: display(metric, value) }),
    i > 0 ? delta(row, metric, value, reference[row.name]) : null,
  ]);
}

const verdictCell = (run, i, byRun) =>
  el("td", { class: "num" }, i > 0 ? [verdict(byRun.get(run.run_id))] : [el("span", { class: "muted small", text: "reference" })]);

const TEST_TITLE = "Mann-Whitney U on per-interval step times; p < 0.01 counts as different";

function renderTable(catalogue, runs, names, tests) {
  const reference = api.shownTotals(runs[0], catalogue);
  const byRun = new Map(tests.map((t) => [t.run_id, t]));
  const table = document.getElementById("compare-table");
  table.classList.toggle("by-run", runs.length > COLUMNS_UP_TO);
  if (runs.length > COLUMNS_UP_TO) {
    // A row per run: the metrics are the columns, so a dozen runs fit without scrolling sideways.
    const head = el("thead", {}, el("tr", {}, [
      el("th", { text: "Run" }),
      ...ROWS.map((row) => el("th", { class: row.headline ? "num headline" : "num", "data-metric": row.name }, metricLabel(metricOf(catalogue, row.name)))),
      el("th", { class: "num", title: TEST_TITLE, text: "Step time vs first run" }),
    ]));
    const rows = runs.map((run, i) =>
      el("tr", { "data-run-id": run.run_id }, [
        el("th", { scope: "row", class: "run-head" }, runHead(run, names[i], i)),
        ...ROWS.map((row) => valueCell(catalogue, row, run, i, reference)),
        verdictCell(run, i, byRun),
      ]),
    );
    return table.replaceChildren(head, el("tbody", {}, rows));
  }
  const head = el("thead", {}, el("tr", {}, [el("th", { text: "" }), ...runs.map((run, i) => el("th", { class: "num run-head", "data-run-id": run.run_id }, runHead(run, names[i], i)))]));
  const rows = ROWS.map((row) =>
    el("tr", { class: row.headline ? "headline" : null, "data-metric": row.name }, [
      el("th", { scope: "row" }, metricLabel(metricOf(catalogue, row.name))),
      ...runs.map((run, i) => valueCell(catalogue, row, run, i, reference)),
    ]),
  );
  rows.push(el("tr", {}, [el("th", { scope: "row", title: TEST_TITLE }, "Step time vs first run"), ...runs.map((run, i) => verdictCell(run, i, byRun))]));
  table.replaceChildren(head, el("tbody", {}, rows));
}

// -- how the runs differ ------------------------------------------------------------------------------
// Config keys that repeat the run's own name and id (the trainer's config holds them): they differ
// in every run by nature, and the columns are headed by them already.
const IDENTITY_KEYS = new Set(["name", "run_id", "run_name"]);

// Each run's settings as dotted keys: its config, then the FLOPs model, parallelism and hardware.
function settingsOf(run) {
  const out = new Map();
  const add = (prefix, value) => {
    for (const key of flatKeys(value)) {
      if (!prefix && IDENTITY_KEYS.has(key)) continue;
      let v = value;
      for (const part of key.split(".")) v = v?.[part];
      out.set(prefix + key, JSON.stringify(v));
    }
  };
  add("", run.config);
  for (const group of ["model", "parallel", "hardware"]) add(`${group}.`, run[group]);
  return out;
}

// The keys whose values are not the same in every run (a key a run lacks counts as different).
function differingKeys(runs) {
  const settings = runs.map(settingsOf);
  const keys = [...new Set(settings.flatMap((s) => [...s.keys()]))].sort();
  const differ = keys.filter((key) => new Set(settings.map((s) => s.get(key) ?? "")).size > 1);
  return { settings, differ, same: keys.length - differ.length };
}

function renderDiff(runs, names) {
  const card = document.getElementById("config-diff");
  card.hidden = runs.length < 2;
  if (card.hidden) return;
  const { settings, differ, same } = differingKeys(runs);
  document.getElementById("config-diff-note").textContent = differ.length
    ? `${differ.length} setting${differ.length === 1 ? "" : "s"} differ; ${same} are the same in every run`
    : `all ${same} settings are the same in every run`;
  const shown = differ.slice(0, MAX_DIFF_ROWS);
  const head = el("thead", {}, el("tr", {}, [el("th", { text: "setting" }), ...names.map((name, i) => el("th", {}, [el("span", { class: "run-swatch", style: `background:${runColor(i)}` }), name]))]));
  const rows = shown.map((key) =>
    el("tr", { "data-key": key }, [
      el("th", { scope: "row" }, el("code", { text: key })),
      ...settings.map((s) => el("td", {}, s.has(key) ? el("code", { text: s.get(key) }) : el("span", { class: "muted", text: "not set" }))),
    ]),
  );
  if (differ.length > shown.length) rows.push(el("tr", {}, el("td", { colspan: runs.length + 1, class: "muted", text: `… and ${differ.length - shown.length} more` })));
  document.getElementById("config-diff-table").replaceChildren(head, el("tbody", {}, rows));
  fillGroupChoices(differ.filter((key) => !/^(model|parallel|hardware)\./.test(key)));
}

// -- groups -------------------------------------------------------------------------------------------
const grouping = { key: new URLSearchParams(location.search).get("group") || "", select: null };

// The group menu: none, the built-in keys, and the config keys in which the runs differ.
function fillGroupChoices(configKeys) {
  const choices = ["", ...GROUP_KEYS, ...configKeys.map((key) => `config:${key}`)];
  if (grouping.key && !choices.includes(grouping.key)) choices.push(grouping.key);
  const select = grouping.select;
  if ([...select.options].map((o) => o.value).join("\n") === choices.join("\n")) return;
  select.replaceChildren(...choices.map((value) => el("option", { value, selected: value === grouping.key, text: value ? keyLabel(value) : "none (a line per run)" })));
}

function setupGrouping(onChange) {
  const select = el("select", { id: "group-by", "aria-label": "group runs by" }, []);
  grouping.select = select;
  select.addEventListener("change", () => {
    grouping.key = select.value;
    updateQuery({ group: grouping.key || null });
    onChange();
  });
  document.getElementById("chart-controls").append(el("label", {}, ["Group runs by ", select]));
  fillGroupChoices([]);
}

// -- the run key ---------------------------------------------------------------------------------------
// The charts' legends are off: a dozen runs' entries took most of a plot's height. One key above
// the charts names each run (or group) in its colour; a click hides it in every chart, or shows it.
const hidden = new Set(); // keys ("run3", "group1") hidden in every chart

// A trace of the run or group `key`, shown unless hidden (a smoothed line's copies are made from it, hidden with it).
const keyed = (trace, key) => ({ ...trace, showlegend: false, visible: hidden.has(key) ? "legendonly" : true });
const withoutLegend = (plotLayout) => ({ ...plotLayout, showlegend: false });

function keyEntries() {
  if (!grouped()) return shown.runs.map((run, i) => ({ key: `run${i}`, label: shown.names[i], title: run.run_id, color: runColor(i) }));
  return groupsOf(shown.runs, grouping.key).map((group, g) => ({ key: `group${g}`, label: `${keyLabel(grouping.key)} = ${group.label}`, color: runColor(g) }));
}

function renderRunKey(redraw) {
  const list = document.getElementById("run-key");
  const entries = keyEntries();
  list.hidden = entries.length === 0;
  list.replaceChildren(
    ...entries.map(({ key, label, title, color }) =>
      el("li", {}, el("button", {
        type: "button",
        class: "run-key-item",
        title: title ? `${title}: click to hide or show in every chart` : "click to hide or show in every chart",
        "aria-pressed": String(!hidden.has(key)),
        onclick: () => {
          if (!hidden.delete(key)) hidden.add(key);
          redraw();
        },
      }, [el("span", { class: "run-swatch", style: `background:${color}` }), label])),
    ),
  );
}

// -- the TFLOP/s chart's measure ----------------------------------------------------------------------
// Which count its lines show (measure= in the URL): both while the runs are few enough to tell
// apart (as many as the table has columns for), one line per run beyond.
const MEASURES = {
  useful: { metrics: ["tflops_useful"], note: "useful: real tokens only, comparable across layouts" },
  "per-document": { metrics: ["tflops_thd"], note: "per-document: every token slot, attention within each document" },
  both: { metrics: ["tflops_useful", "tflops_thd"], note: "solid: useful, dashed: per-document" },
};
const measure = { chosen: new URLSearchParams(location.search).get("measure") };
const measureShown = () => (measure.chosen in MEASURES ? measure.chosen : shown.runs.length > COLUMNS_UP_TO ? "useful" : "both");

function setupMeasure(onChange) {
  const select = /** @type {HTMLSelectElement} */ (document.getElementById("tflops-measure"));
  select.addEventListener("change", () => {
    measure.chosen = select.value;
    updateQuery({ measure: measure.chosen });
    onChange();
  });
}

// Per group, the mean of `metric` over its runs at each step with the min–max band around it.
/**
 * @param {(name: string) => Metric} m
 * @param {string} metricName
 * @param {{ suffix?: string, dash?: string, withBand?: boolean }} [options]
 */
function groupTraces(m, metricName, { suffix, dash = "solid", withBand = true } = {}) {
  const metric = metricFor(m, metricName);
  return groupsOf(shown.runs, grouping.key).flatMap((group, g) => {
    const list = group.indexes.map((i) => shown.seriesList[i]).filter((series) => series.points && metricName in series.columns);
    if (!list.length) return [];
    const merged = groupSeries(list, metricName);
    const name = `${keyLabel(grouping.key)} = ${group.label} (${list.length} run${list.length === 1 ? "" : "s"})${suffix ? ` · ${suffix}` : ""}`;
    const mean = line(metricName, metric, runColor(g), { name, dash });
    /** @type {object[]} */
    const traces = [{ ...mean, x: merged.step, y: merged.mean, meta: { ...mean.meta, column: `group${g}:${metricName}`, csv: `${name}:mean` } }];
    if (withBand && list.length > 1) {
      const [max, min] = band(`group${g}:${metricName}`, name, runColor(g));
      traces.unshift({ ...max, x: merged.step, y: merged.max, meta: { ...max.meta, csv: `${name}:max` } }, { ...min, x: merged.step, y: merged.min, meta: { ...min.meta, csv: `${name}:min` } });
    }
    return traces.map((trace) => keyed(trace, `group${g}`));
  });
}

const grouped = () => Boolean(grouping.key);
const GROUP_NOTE = "one line per group: the mean of its runs at each step; shaded: their min–max";

// A chart card's note says what its lines are: runs, or groups of runs.
function drawn(panel, traces, plotLayout) {
  panel.draw(traces, withoutLegend(plotLayout), chartSettings());
  if (grouped() && panel.note) panel.note.textContent = GROUP_NOTE;
}
// Groups align runs by step: their charts are drawn against step whatever the x axis chosen.
const chartSettings = () => (grouped() ? { ...settings, x: "step" } : settings);

function noteGroups() {
  const note = document.getElementById("group-note");
  note.hidden = !grouped();
  if (!grouped()) return;
  const groups = groupsOf(shown.runs, grouping.key);
  const stepOnly = settings.x !== "step" ? " Groups are drawn against step: runs are matched step by step." : "";
  note.textContent = `${shown.runs.length} runs in ${groups.length} group${groups.length === 1 ? "" : "s"} by ${keyLabel(grouping.key)}: each line is the mean of the group's runs at each step, the band their min–max.${stepOnly}`;
}

// A catalogue metric, or a channel's loss under the catalogue's loss format.
const metricFor = (m, name) => (isChannel(name) ? channelMetric(m("loss"), name) : m(name));

// The metrics offered: the catalogue's, then each channel any compared run reports, then the
// overlay's own choice (a channel from the URL before the runs have loaded).
function overlayChoices(current) {
  const channels = new Set((shown?.seriesList || []).flatMap((series) => Object.keys(series.columns).filter(isChannel)));
  return [...new Set([...OVERLAY_METRICS, ...[...channels].sort(), current])];
}

// Rebuilt only when the choices change: a refresh must not close a menu the user has open.
function fillChoices(m, overlay) {
  const choices = overlayChoices(overlay.metric);
  if (choices.join("\n") === [...overlay.select.options].map((o) => o.value).join("\n")) return;
  overlay.select.replaceChildren(
    ...choices.map((name) => el("option", { value: name, selected: name === overlay.metric, text: metricFor(m, name).label })),
  );
}

// One overlay card per chosen metric, cloned from the page's <template>; `metric` is read at each draw.
const overlays = [];
let overlaysMade = 0;

function saveOverlays() {
  updateQuery({ metric: overlays.map((overlay) => overlay.metric) });
}

function addOverlay(m, metric) {
  const template = /** @type {HTMLTemplateElement} */ (document.getElementById("overlay-template"));
  const card = /** @type {HTMLElement} */ (template.content.firstElementChild.cloneNode(true));
  card.id = `chart-overlay-${overlaysMade++}`;
  const overlay = { metric, card };
  const select = el(
    "select",
    {
      class: "overlay-metric",
      "aria-label": "metric",
      onchange: () => {
        overlay.metric = select.value;
        saveOverlays();
        drawOverlay(m, overlay);
      },
    },
    [],
  );
  overlay.select = select;
  fillChoices(m, overlay);
  const remove = el("button", {
    type: "button",
    class: "overlay-remove",
    title: "Remove this chart",
    text: "×",
    onclick: () => {
      overlays.splice(overlays.indexOf(overlay), 1);
      Plotly.purge(overlay.panel.plot);
      card.remove();
      saveOverlays();
    },
  });
  card.querySelector("h2").replaceChildren(select);
  card.querySelector(".card-head").append(remove);
  document.getElementById("overlays").append(card);
  overlay.panel = new ChartPanel(card, { filename: "compare-overlay.csv" });
  overlays.push(overlay);
  drawOverlay(m, overlay);
}

// Per run, one trace of `metric` against the controls' x axis, named ("run · suffix") and coloured by run.
/**
 * @param {(name: string) => Metric} m
 * @param {string} metric
 * @param {{ suffix?: string, dash?: string, width?: number }} [options]
 */
function perRun(m, metric, { suffix, ...style } = {}) {
  const { names, seriesList } = shown;
  return seriesList.flatMap((series, i) => {
    if (!series.points || !(metric in series.columns)) return []; // a channel this run does not report
    const trace = line(metric, metricFor(m, metric), runColor(i), { name: suffix ? `${names[i]} · ${suffix}` : names[i], ...style });
    return fill([keyed({ ...trace, meta: { ...trace.meta, csv: `${names[i]}:${metric}` } }, `run${i}`)], series.columns, X_AXES[settings.x].column);
  });
}

function drawOverlay(m, overlay) {
  if (!shown) return;
  const traces = grouped() ? groupTraces(m, overlay.metric) : perRun(m, overlay.metric);
  const metric = metricFor(m, overlay.metric);
  if (!traces.some((t) => t.y.some((v) => v !== null))) {
    return overlay.panel.showEmpty(shown.seriesList.some((s) => s.points) ? `No run reported ${metric.label}.` : WAITING);
  }
  const loss = overlay.metric === "loss" || isChannel(overlay.metric);
  drawn(overlay.panel, traces, layout({ yTitle: metric.label, metric, fromZero: !loss }));
}

// The TFLOP/s chart draws the measure's counts: the first solid, a second (per-document) dashed.
function tflopsTraces(m) {
  const [first, second] = MEASURES[measureShown()].metrics;
  const suffix = (name) => m(name).label.replace(/ TFLOP\/s.*$/, "");
  if (grouped()) {
    const dashed = second ? groupTraces(m, second, { suffix: suffix(second), dash: "dash", withBand: false }) : [];
    return [...groupTraces(m, first, { suffix: suffix(first) }), ...dashed];
  }
  if (!second) return perRun(m, first);
  const dashed = perRun(m, second, { suffix: suffix(second), dash: "dash", width: 1.5 });
  return perRun(m, first, { suffix: suffix(first) }).flatMap((solid, i) => [solid, dashed[i]]);
}

function renderCharts(m) {
  noteGroups();
  renderRunKey(() => renderCharts(m));
  for (const overlay of overlays) {
    fillChoices(m, overlay);
    drawOverlay(m, overlay);
  }
  if (!shown.seriesList.some((series) => series.points)) {
    panels.tflops.showEmpty(WAITING);
    panels.step_time.showEmpty(WAITING);
    return;
  }
  const tflopsLayout = layout({ yTitle: "TFLOP/s per GPU", metric: m("tflops_useful") });
  const stepLayout = layout({ yTitle: "seconds per step", metric: m("step_time_s") });
  /** @type {HTMLSelectElement} */ (document.getElementById("tflops-measure")).value = measureShown();
  panels.tflops.baseNote = MEASURES[measureShown()].note;
  drawn(panels.tflops, tflopsTraces(m), tflopsLayout);
  drawn(panels.step_time, grouped() ? groupTraces(m, "step_time_s") : perRun(m, "step_time_s"), stepLayout);
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
  for (const id of ["compare-table-card", "config-diff", "chart-controls", "run-key", "overlays", "add-overlay"]) document.getElementById(id).hidden = true;
  for (const panel of Object.values(panels)) panel.element.hidden = true;
}

// The template counts the ids asked for; the heading counts the runs found, which are compared.
function showCount(found) {
  document.querySelector("h1").textContent = `Compare ${found} run${found === 1 ? "" : "s"}`;
}

async function load(catalogue, runIds) {
  const m = (name) => metricOf(catalogue, name);
  const { runs, step_time_tests: tests } = await api.compareRuns(runIds);
  const names = labels(runs);
  const seriesList = await Promise.all(runs.map((run) => api.getSeries(run.run_id, { max_points: MAX_POINTS })));
  for (const series of seriesList) Object.assign(series.columns, xColumns(series), channelColumns(series));
  shown = { runs, names, seriesList };
  showCount(runs.length);
  renderTable(catalogue, runs, names, tests);
  renderDiff(runs, names);
  renderCharts(m);
  await showCompareLedgers(runs.map((run) => run.run_id), names);
  return runs.some((run) => run.status === "running");
}

// Keeps refreshing while any compared run is still running. A 404 means some id is unknown:
// those are named and the rest compared, instead of retrying the whole set forever.
async function loop(catalogue, runIds) {
  let running;
  try {
    running = await load(catalogue, runIds);
    showError(null);
  } catch (error) {
    if (/** @type {{ status?: number }} */ (error).status === 404) return compareKnown(catalogue, runIds);
    showError(error);
    running = true;
  }
  if (running) setTimeout(() => loop(catalogue, runIds), REFRESH_MS);
}

async function compareKnown(catalogue, runIds) {
  try {
    const { known, unknown } = await knownIds(runIds);
    reportUnknown(unknown, known);
    if (!known.length) {
      showCount(0);
      return hideResults();
    }
    return loop(catalogue, known);
  } catch (error) {
    showError(error);
  }
}

async function start() {
  if (!requestedIds.length) return hideResults();
  try {
    const catalogue = await loadCatalogue();
    const m = (name) => metricOf(catalogue, name);
    renderControls(document.getElementById("chart-controls"), settings, () => shown && renderCharts(m));
    setupGrouping(() => shown && renderCharts(m));
    setupMeasure(() => shown && renderCharts(m));
    const asked = new URLSearchParams(location.search).getAll("metric").filter((name) => OVERLAY_METRICS.includes(name) || isChannel(name));
    for (const metric of asked.length ? asked : OVERLAY_METRICS.slice(0, 1)) addOverlay(m, metric);
    document.getElementById("add-overlay").addEventListener("click", () => {
      addOverlay(m, OVERLAY_METRICS[0]);
      saveOverlays();
    });
    renderDefinitions(catalogue, ROWS.map((row) => row.name));
    await loop(catalogue, requestedIds);
  } catch (error) {
    showError(error);
  }
}

start();
