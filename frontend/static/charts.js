// Plotly builders: one colour per metric everywhere, bands for min–max, and a chart panel
// that shows an empty state until there is data and extends in place when new data arrives.

import { csvLink, tracesToCSV } from "./csv.js";

export const COLORS = {
  baseline: "#d97706", // amber: the dense BSHD count that over-reports packed runs
  thd: "#2563eb", // blue: the THD-corrected count, the headline number
  useful: "#059669", // green: real tokens only
  overcount: "#dc2626",
  neutral: "#475569",
  documents: "#7c3aed",
  packs: "#0891b2",
};

// Distinct colours for runs on the compare page, kept apart from the metric colours above.
export const RUN_COLORS = ["#7c3aed", "#0891b2", "#db2777", "#65a30d", "#334155", "#ea580c", "#4f46e5", "#0f766e"];

const FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';

export function layout({ yTitle, xTitle = "step", ySuffix = "", yFormat = "", barmode, xType, fromZero = true } = {}) {
  return {
    font: { family: FONT, size: 12, color: "#1f2937" },
    margin: { l: 64, r: 16, t: 8, b: 44 },
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
    hovermode: "x unified",
    showlegend: true,
    // "normal" keeps legend order = trace order; fill traces would otherwise reverse it.
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom", font: { size: 11 }, traceorder: "normal" },
    xaxis: { title: { text: xTitle }, gridcolor: "#e5e7eb", zeroline: false, type: xType, automargin: true },
    yaxis: {
      title: { text: yTitle },
      gridcolor: "#e5e7eb",
      zeroline: false,
      rangemode: fromZero ? "tozero" : "normal",
      ticksuffix: ySuffix,
      tickformat: yFormat,
      automargin: true,
    },
    barmode,
    uirevision: "keep", // redraws keep the user's zoom
  };
}

// meta.column names the series column a trace plots, so live updates can extend it generically.
export function line(column, name, color, { dash = "solid", hoverFormat = ".3r", unit = "", width = 2, rank } = {}) {
  return {
    type: "scatter",
    mode: "lines",
    name,
    legendrank: rank,
    line: { color, dash, width },
    hovertemplate: `%{y:${hoverFormat}}${unit}<extra>${name}</extra>`,
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

const CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

// A .chart element from the templates: holds the plot, the empty-state note and the CSV link.
export class ChartPanel {
  constructor(element, { filename, xName = "step" }) {
    this.element = element;
    this.plot = element.querySelector(".plot");
    this.note = element.querySelector(".empty");
    this.drawn = false;
    element.querySelector(".chart-foot").append(
      csvLink(filename, () => tracesToCSV(this.plot.data || [], xName)),
    );
  }

  showEmpty(message) {
    this.note.textContent = message;
    this.element.classList.add("is-empty");
    if (this.drawn) Plotly.purge(this.plot);
    this.drawn = false;
  }

  draw(traces, plotLayout) {
    this.element.classList.remove("is-empty");
    Plotly.react(this.plot, traces, plotLayout, CONFIG);
    this.drawn = true;
  }

  // Appends new points to every trace; each trace reads its own column from `columns`.
  extend(columns, xColumn = "step") {
    const traces = this.plot.data;
    const indices = traces.map((_, i) => i);
    const x = traces.map(() => columns[xColumn]);
    const y = traces.map((trace) => columns[trace.meta.column]);
    Plotly.extendTraces(this.plot, { x, y }, indices);
  }
}

// Fills each trace's x/y from columnar series data (see docs/api.md, series).
export function fill(traces, columns, xColumn = "step") {
  return traces.map((trace) => ({ ...trace, x: [...columns[xColumn]], y: [...columns[trace.meta.column]] }));
}
