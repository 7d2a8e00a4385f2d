// @ts-check
// Plotly builders: catalogue formats in hovers, min–max bands, upload-free plots, the chart
// controls' settings (x axis, log y, smoothing) applied to a plot, and a chart panel that shows an
// empty state until there is data.

import { afterClick, drawLegend, entryKey, hideTraces, legendBox, legendEntries, showPressed } from "./chart_legend.js";
import { X_AXES } from "./controls.js";
import { csvLink, tracesToCSV } from "./csv.js";
import { bandHasWidth, extension } from "./extension.js";
import { prefixJoinsUnit, unitSuffix } from "./format.js";
import { linkX, unlinkX } from "./linkedzoom.js";
import { ema } from "./smoothing.js";
import { durationTicks, hms } from "./timeaxis.js";
import { unitTicks, yExtent } from "./unitaxis.js";

const FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
const BAND_NOTE = "shaded: min–max of the intervals in each point";

// Tick labels trim trailing zeros ("100", not "100.0"); hovers keep the catalogue's exact format.
const tickFormat = (spec) => (spec ? spec.replace(/([a-z%])$/, "~$1") : "");

// `metric` (a catalogue entry) gives the y axis its tick format and unit unless yFormat names one.
// A unit that takes the SI prefix ("GB") gets its ticks from unitaxis.js (meta.unitAxis).
/**
 * @param {{ yTitle?: string, metric?: Metric, yFormat?: string, xTitle?: string, barmode?: string,
 *   xType?: string, fromZero?: boolean }} [options]
 */
export function layout({ yTitle, metric, yFormat, xTitle = "step", barmode, xType, fromZero = true } = {}) {
  const unitAxis = metric && !yFormat && prefixJoinsUnit(metric);
  return {
    ...(unitAxis ? { meta: { unitAxis: metric, fromZero } } : {}),
    font: { family: FONT, size: 12, color: "#1f2937" },
    // r: room for half the last x tick label, which automargin would otherwise make by growing
    // the margin whenever a tick reaches the right end and shrinking it back after: on a live
    // chart, a second whole plotly pass on every other extension (docs/benchmarks/2026-12-06-2core-live.md).
    margin: { l: 64, r: 24, t: 8, b: 44 },
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
    hovermode: "x unified",
    showlegend: true, // the page's legend above the plot (chart_legend.js); plotly's is always off
    // The standoffs keep the y "0" and the first x tick apart where they meet at the origin.
    // ticklabeloverflow "allow": the margins hold every tick label (automargin, and r above), so
    // plotly's default ("hide past div") hid none, yet measured each label's box on each drawing
    // to find out, a third of a live extension's time.
    xaxis: { title: { text: xTitle }, gridcolor: "#e5e7eb", zeroline: false, type: xType, automargin: true, ticklabelstandoff: 6, ticklabeloverflow: "allow" },
    yaxis: {
      title: { text: yTitle },
      gridcolor: "#e5e7eb",
      zeroline: false,
      rangemode: fromZero ? "tozero" : "normal",
      ticksuffix: metric && !unitAxis ? unitSuffix(metric) : "",
      tickformat: unitAxis ? "" : (yFormat ?? tickFormat(metric?.format)),
      ticklabelstandoff: 6,
      ticklabeloverflow: "allow",
      automargin: true,
    },
    barmode,
    uirevision: "keep", // redraws keep the user's zoom
  };
}

// One series column as a line, named and hover-formatted from its catalogue metric.
// meta.column names the column it plots, so fill() reads it from any series of columns.
// markers: a dot on every point, for a metric defined at isolated intervals between gaps (syncs,
// which the agent counts one interval in a few), where a line alone would show nothing.
/**
 * @param {string} column
 * @param {Metric} metric
 * @param {string} color
 * @param {{ name?: string, dash?: string, width?: number, rank?: number, markers?: boolean }} [options]
 */
export function line(column, metric, color, { name = metric.label, dash = "solid", width = 2, rank, markers = false } = {}) {
  return {
    type: "scatter",
    mode: markers ? "lines+markers" : "lines",
    ...(markers ? { marker: { color, size: 4 } } : {}),
    name,
    legendrank: rank,
    line: { color, dash, width },
    hovertemplate: `%{y:${metric.format}}${unitSuffix(metric)}<extra>${name}</extra>`,
    meta: { column, kind: "line", csv: column },
    x: [],
    y: [],
  };
}

// Two traces: the max edge, then the min edge filled up to it ("tonexty").
export function band(column, name, color) {
  const edge = (suffix, fill) => ({
    type: "scatter",
    mode: "lines",
    name: `${name} ${suffix}`,
    line: { width: 0, color },
    fill,
    fillcolor: translucent(color, 0.15),
    hoverinfo: "skip",
    showlegend: false,
    meta: { column: `${column}_${suffix}`, kind: "band", csv: `${column}_${suffix}` },
    x: [],
    y: [],
  });
  return [edge("max", "none"), edge("min", "tonexty")];
}

export function bar(name, color, x, y) {
  return {
    type: "bar",
    name,
    x,
    y,
    marker: { color },
    hovertemplate: `%{y:.3s} tokens<extra>${name}</extra>`,
    meta: { kind: "bar", csv: name },
  };
}

function translucent(hex, alpha) {
  const value = parseInt(hex.slice(1), 16);
  return `rgba(${(value >> 16) & 255}, ${(value >> 8) & 255}, ${value & 255}, ${alpha})`;
}

// Nothing on a chart may upload data or link off the server: no logo link, no cloud buttons.
export const CONFIG = {
  responsive: true,
  displaylogo: false,
  showSendToCloud: false,
  showEditInChartStudio: false,
  showLink: false,
  modeBarButtonsToRemove: ["lasso2d", "select2d", "sendDataToCloud", "editInChartStudio"],
};

// A band is worth announcing only where it has a width: one interval per point has none.
function bandsShow(traces) {
  const columns = Object.fromEntries(traces.filter((t) => t.meta?.kind === "band").map((t) => [t.meta.column, t.y]));
  return Object.keys(columns).some((column) => bandHasWidth(columns, column));
}

// A chart card's note: the template's, and what the shading means where a band shows.
export const chartNote = (baseNote, traces) => [baseNote, bandsShow(traces) ? BAND_NOTE : ""].filter(Boolean).join("; ");

// With smoothing, each line is drawn twice: the raw values faded and without hover, the EMA over
// them in full colour (W&B's look). One legend entry toggles both (they share their column).
function smoothed(traces, weight) {
  if (!weight) return traces;
  const isLine = (t) => t.meta?.kind === "line";
  // hovertemplate outranks hoverinfo, so the faded copy drops it or the hover box lists it too.
  // eslint-disable-next-line no-unused-vars -- destructured only to leave hovertemplate out of the copy
  const fade = ({ hovertemplate, ...t }) => ({ ...t, opacity: 0.3, showlegend: false, hoverinfo: "skip" });
  const faded = traces.map((t) => (isLine(t) ? fade(t) : t));
  const smooth = traces.filter(isLine).map((t) => ({ ...t, y: ema(t.y, weight), meta: { ...t.meta, kind: "smoothed" } }));
  return [...faded, ...smooth];
}

// The smallest and largest finite x of the traces: the range a duration axis labels.
/** @returns {[number, number]} */
function xExtent(traces) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const t of traces) {
    for (const x of t.x || []) {
      if (typeof x === "number" && Number.isFinite(x)) [lo, hi] = [Math.min(lo, x), Math.max(hi, x)];
    }
  }
  return [lo, hi];
}

// Hovers on a relative-time axis read h:mm:ss like its ticks: plotly formats a hovered x with
// hoverformat (whole seconds), and labelalias swaps each such text of a point for its h:mm:ss.
function durationHovers(traces) {
  const alias = {};
  for (const t of traces) {
    for (const x of t.x || []) {
      if (typeof x === "number" && Number.isFinite(x) && x >= 0) alias[x.toFixed(0)] = hms(Number(x.toFixed(0)));
    }
  }
  return { hoverformat: ".0f", labelalias: alias };
}

// The x axis of each choice: step plain, tokens in SI units, wall clock as dates, relative time
// in h:mm:ss ticks over the range shown, and in hovers.
function xAxisFor(x, traces) {
  if (x === "tokens") return { tickformat: "~s" };
  if (x === "wall") return { type: "date" };
  if (x === "elapsed") return { tickmode: "array", ...durationTicks(...xExtent(traces)), ...durationHovers(traces) };
  return {};
}

// What a series plot shows under the controls' settings: its traces (smoothed) and layout (axes).
// ChartPanel.draw hands it to plotly; sketch.js draws the same figure before plotly.js runs.
export function seriesFigure(traces, plotLayout, settings) {
  const shown = smoothed(traces, settings.smoothing);
  return { traces: shown, layout: withAxes(plotLayout, settings, shown) };
}

// The ticks of a y axis from unitaxis.js over [lo, hi], or over the traces' values.
function yTicks(plotLayout, traces, range) {
  const unit = plotLayout.meta?.unitAxis;
  if (!unit) return {};
  const log = plotLayout.yaxis?.type === "log";
  const [lo, hi] = range ? range.map((v) => (log ? 10 ** v : v)) : yExtent(traces, plotLayout.meta.fromZero && !log);
  return unitTicks(unit, lo, hi, log);
}

// The controls' settings on a series plot's layout. uirevision follows the axes' units, so a
// zoom kept across redraws is dropped when its units change.
function withAxes(plotLayout, { x, log }, traces) {
  const axis = X_AXES[x];
  const yaxis = { ...plotLayout.yaxis, type: log ? "log" : "linear" };
  return {
    ...plotLayout,
    xaxis: { ...plotLayout.xaxis, title: { text: axis.title }, type: axis.type ?? "linear", ...xAxisFor(x, traces) },
    yaxis: { ...yaxis, ...yTicks({ ...plotLayout, yaxis }, traces) },
    uirevision: `${x}:${log ? "log" : "linear"}`,
  };
}

const rangeChanged = (event, axis) => `${axis}.range[0]` in event || `${axis}.range` in event || event[`${axis}.autorange`];

// A zoom or pan on a relative-time x axis relabels its h:mm:ss ticks for the new range, on a
// unit y axis its ticks.
function relabelTicks(plot, event) {
  const update = {};
  if (plot.layout?.xaxis?.tickmode === "array" && rangeChanged(event, "xaxis")) {
    const [lo, hi] = event["xaxis.autorange"] ? xExtent(plot.data) : plot.layout.xaxis.range;
    const { tickvals, ticktext } = durationTicks(lo, hi);
    Object.assign(update, { "xaxis.tickvals": tickvals, "xaxis.ticktext": ticktext });
  }
  if (plot.layout?.meta?.unitAxis && rangeChanged(event, "yaxis")) {
    const { tickvals, ticktext } = yTicks(plot.layout, plot.data, event["yaxis.autorange"] ? null : plot.layout.yaxis.range);
    Object.assign(update, { "yaxis.tickvals": tickvals, "yaxis.ticktext": ticktext });
  }
  if (Object.keys(update).length) Plotly.relayout(plot, update);
}

// What a drawn series chart was drawn from: its traces' columns, the settings, and which held
// series (run.js counts a series re-fetched whole as a new one). A live extension must match it.
const figureKey = (traces, { x, log, smoothing }, series) => JSON.stringify([traces.map((t) => t.meta.column), x, log, smoothing, series]);

// A .chart element from the templates: holds the plot, the empty-state note and the CSV link.
// linked: the chart plots against the series' x axis and zooms together with the page's other such charts.
export class ChartPanel {
  constructor(element, { filename, xName = "step", linked = xName === "step" }) {
    this.element = element;
    this.plot = element.querySelector(".plot");
    this.empty = element.querySelector(".empty");
    this.note = element.querySelector(".card-head .note");
    // The first drawing (sketch.js) may have added to the note already; it keeps the template's.
    this.baseNote = this.note?.dataset.base ?? this.note?.textContent.trim() ?? "";
    this.linked = linked;
    this.xName = xName;
    this.drawn = false;
    this.figure = null; // figureKey of the series drawn, with `points` of it
    this.points = 0;
    this.legend = legendBox(this.plot);
    this.hidden = new Set(); // the legend's entries hidden (their keys), kept across redraws
    // The CSV holds what was measured: smoothed lines are a view of it and stay out.
    element.querySelector(".chart-foot").append(
      csvLink(filename, () => tracesToCSV((this.plot.data || []).filter((t) => t.meta?.kind !== "smoothed"), this.xName)),
    );
  }

  showEmpty(message) {
    this.plot.querySelector(":scope > .sketch")?.remove();
    this.legend.hidden = true;
    this.empty.textContent = message;
    this.element.classList.add("is-empty");
    if (this.drawn) {
      unlinkX(this.plot);
      Plotly.purge(this.plot);
    }
    this.drawn = false;
    this.figure = null;
  }

  // settings (from controls.js), for a series plot: traces filled against X_AXES[settings.x].column;
  // series: which held series they were filled from (see extend).
  draw(traces, plotLayout, settings, series = null) {
    this.figure = settings ? figureKey(traces, settings, series) : null;
    this.points = traces[0]?.x?.length ?? 0;
    if (settings) {
      ({ traces, layout: plotLayout } = seriesFigure(traces, plotLayout, settings));
      this.xName = X_AXES[settings.x].column;
    }
    this.element.classList.remove("is-empty");
    this.plot.querySelector(":scope > .sketch")?.remove(); // the first drawing (sketch.js), in the same frame
    const entries = legendEntries(traces, plotLayout);
    drawLegend(this.legend, entries, this.hidden, (key, alone) => this.showOnly(entries, afterClick(entries, this.hidden, key, alone)));
    Plotly.react(this.plot, hideTraces(traces, this.hidden), { ...plotLayout, showlegend: false }, CONFIG);
    if (this.linked) linkX(this.plot);
    if (!this.drawn && settings) this.plot.on("plotly_relayout", (event) => relabelTicks(this.plot, event));
    this.drawn = true;
    this.describeBands();
  }

  // A live event's new points: the traces (as given to draw, unfilled) grow by the points of
  // `columns` past those drawn (Plotly.extendTraces), where that gives what draw() would: the same
  // traces and settings, the same held series, and axes not labelled from the data (relative
  // time's ticks and hovers and SI-prefixed y ticks are: those charts are drawn anew). Returns
  // whether it did; the caller draws the chart whole otherwise.
  extend(traces, plotLayout, settings, series, columns) {
    if (!this.drawn || this.figure !== figureKey(traces, settings, series)) return false;
    if (settings.x === "elapsed" || plotLayout.meta?.unitAxis) return false;
    const xColumn = X_AXES[settings.x].column;
    const grown = extension(this.plot.data || [], columns, this.points, xColumn, settings.smoothing);
    if (!grown) return false;
    if (columns[xColumn].length > this.points) extendKeepingMargins(this.plot, grown.update, grown.indices);
    this.points = columns[xColumn].length;
    this.describeBands();
    return true;
  }

  // The legend's entries `hidden` hidden and the others shown, in the plot as drawn (live
  // extensions included); a band without a width stays hidden.
  showOnly(entries, hidden) {
    this.hidden = hidden;
    showPressed(this.legend, hidden);
    const keys = new Set(entries.map((e) => e.key));
    const data = this.plot.data || [];
    const indices = data.flatMap((t, i) => (t.visible !== false && keys.has(entryKey(t)) ? [i] : []));
    const visible = indices.map((i) => (hidden.has(entryKey(data[i])) ? "legendonly" : true));
    Plotly.restyle(this.plot, { visible }, indices);
  }

  describeBands() {
    if (this.note) this.note.textContent = chartNote(this.baseNote, this.plot.data || []);
  }
}

// The tick labels' longest text on each axis of a drawn plot (plotly's ticks as last drawn).
const longestLabels = (full) =>
  ["xaxis", "yaxis"].map((axis) => Math.max(0, ...(full[axis]?._vals ?? []).map((tick) => String(tick.text ?? "").length)));

// A live extension is a whole plotly pass, and much of one is measuring the axes' tick labels:
// their boxes size the margins (automargin) and choose the labels' angle. Between extensions the
// labels seldom change, so this pass keeps what the last one chose (its margins and angles, set,
// automargin off, for this pass alone). A tick label longer than the last pass drew may need more
// room: the chart is then drawn again with its axes measured, before the frame is painted.
/** @param {PlotlyPlot} plot */
function extendKeepingMargins(plot, update, indices) {
  const full = plot._fullLayout;
  if (!full?._size) return Plotly.extendTraces(plot, update, indices);
  const { l, r, b, t } = full._size;
  const own = { margin: plot.layout.margin, xaxis: plot.layout.xaxis, yaxis: plot.layout.yaxis };
  const angle = (axis) => full[axis]._tickAngles?.[`${axis[0]}tick`] ?? own[axis]?.tickangle;
  const before = longestLabels(full);
  plot.layout.margin = { ...own.margin, l, r, b, t };
  for (const axis of ["xaxis", "yaxis"]) plot.layout[axis] = { ...own[axis], automargin: false, tickangle: angle(axis) };
  try {
    Plotly.extendTraces(plot, update, indices);
  } finally {
    Object.assign(plot.layout, own);
  }
  if (longestLabels(plot._fullLayout).some((length, i) => length > before[i])) Plotly.redraw(plot);
}

// Fills each trace's x/y from columnar series data (see docs/api.md, series). A band without a
// width anywhere (one interval a point, as in a run shorter than the points asked for) would hide
// under its line: plotly skips it (visible false, which costs a live extension nothing), and its
// values stay in the chart's CSV.
export function fill(traces, columns, xColumn = "step") {
  return traces.map((trace) => ({
    ...trace,
    x: [...columns[xColumn]],
    y: [...columns[trace.meta.column]],
    ...(trace.meta.kind === "band" ? { visible: bandHasWidth(columns, trace.meta.column) } : {}),
  }));
}
