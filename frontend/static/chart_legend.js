// @ts-check
// A chart's legend, drawn by the page above the plot instead of by plotly: plotly draws and
// measures its legend again on every pass, live extensions included; the page draws it once a
// figure (what that saves: docs/benchmarks/2026-12-07-2core.md, "live-legend"). One entry a named
// line (or bar trace), in legendrank order. A click hides the entry or shows it again, with its
// min–max band and its faded raw copy. A double click shows it alone, or all of them when it is
// shown alone already: plotly's legend gestures.

/**
 * @typedef {{ key: string, name: string, color: string, dash: string, width: number, bar: boolean }} LegendEntry
 * @typedef {{ name?: string, type?: string, showlegend?: boolean, legendrank?: number, visible?: boolean | string,
 *   line?: { color?: string, dash?: string, width?: number }, marker?: { color?: string },
 *   meta?: { kind?: string, column?: string } }} LegendTrace
 */

import { el, svgNode } from "./dom.js";
import { bandBase } from "./extension.js";

const NAMED_KINDS = new Set(["line", "smoothed", "bar"]);

/**
 * The entry a trace belongs to: its column's (a band edge's, the column it shades), else its name.
 * @param {LegendTrace} trace
 */
export function entryKey(trace) {
  const { kind, column } = trace.meta ?? {};
  if (kind === "band" && column) return bandBase(column);
  return column ?? trace.name ?? "";
}

/**
 * The legend of a figure: none where its layout turns the legend off, else one entry a key among
 * the traces that name themselves (lines, their smoothed copies, bars), ranked as plotly ranks them.
 * @param {LegendTrace[]} traces
 * @param {{ showlegend?: boolean }} layout
 * @returns {LegendEntry[]}
 */
export function legendEntries(traces, layout) {
  if (layout.showlegend === false) return [];
  const named = traces
    .map((trace, i) => ({ trace, i }))
    .filter(({ trace }) => trace.showlegend !== false && NAMED_KINDS.has(trace.meta?.kind ?? ""))
    .sort((a, b) => (a.trace.legendrank ?? 1000) - (b.trace.legendrank ?? 1000) || a.i - b.i);
  /** @type {Map<string, LegendEntry>} */
  const entries = new Map();
  for (const { trace } of named) {
    const key = entryKey(trace);
    if (entries.has(key)) continue;
    const bar = trace.type === "bar";
    const color = (bar ? trace.marker?.color : trace.line?.color) ?? "currentColor";
    entries.set(key, { key, name: trace.name ?? key, color, dash: trace.line?.dash ?? "solid", width: trace.line?.width ?? 2, bar });
  }
  return [...entries.values()];
}

/**
 * The traces with those of the hidden entries set "legendonly" (plotly's hidden); a trace that
 * hides itself (visible false: a band without a width) stays as it is.
 * @template {LegendTrace} T
 * @param {T[]} traces
 * @param {Set<string>} hidden
 * @returns {T[]}
 */
export function hideTraces(traces, hidden) {
  if (!hidden.size) return traces;
  return traces.map((t) => (t.visible !== false && hidden.has(entryKey(t)) ? { ...t, visible: "legendonly" } : t));
}

/**
 * The hidden keys after a click (toggle) or a double click (alone) on `key`.
 * @param {LegendEntry[]} entries
 * @param {Set<string>} hidden
 * @param {string} key
 * @param {boolean} alone
 */
export function afterClick(entries, hidden, key, alone) {
  const next = new Set(hidden);
  if (!alone) {
    if (!next.delete(key)) next.add(key);
    return next;
  }
  const others = entries.map((e) => e.key).filter((k) => k !== key);
  const shownAlone = !hidden.has(key) && others.every((k) => hidden.has(k));
  return shownAlone ? new Set() : new Set(others);
}

/**
 * Plotly's dash patterns, scaled by the line width as plotly scales them (undefined: solid).
 * @param {string | undefined} dash
 * @param {number} width
 */
export function dashArray(dash, width) {
  const w = Math.max(width, 3);
  /** @type {Record<string, string>} */
  const patterns = { dash: `${3 * w} ${3 * w}`, dot: `${w} ${w}`, longdash: `${5 * w} ${5 * w}`, dashdot: `${3 * w} ${w} ${w} ${w}` };
  return dash ? patterns[dash] : undefined;
}

/**
 * The legend's box of a chart: the `.chart-legend` before its plot element, made where missing.
 * @param {HTMLElement} plot
 * @returns {HTMLElement}
 */
export function legendBox(plot) {
  const before = plot.previousElementSibling;
  if (before instanceof HTMLElement && before.classList.contains("chart-legend")) return before;
  const label = "legend: click to hide or show a line, double-click to show it alone";
  const box = el("div", { class: "chart-legend", role: "group", "aria-label": label, hidden: true });
  plot.before(box);
  return box;
}

/**
 * The entries as buttons in `box` (hidden where there are none). onClick(key, alone): a click
 * (alone false) or a double click (alone true); without it (a still drawing) the buttons wait.
 * @param {HTMLElement} box
 * @param {LegendEntry[]} entries
 * @param {Set<string>} hidden
 * @param {((key: string, alone: boolean) => void) | null} [onClick]
 */
export function drawLegend(box, entries, hidden, onClick = null) {
  box.hidden = entries.length === 0;
  box.replaceChildren(
    ...entries.map((entry) =>
      el(
        "button",
        {
          type: "button",
          class: "legend-entry",
          "data-key": entry.key,
          "aria-pressed": String(!hidden.has(entry.key)),
          onclick: onClick && (() => onClick(entry.key, false)),
          ondblclick: onClick && (() => onClick(entry.key, true)),
        },
        [sample(entry), el("span", { text: entry.name })],
      ),
    ),
  );
}

/**
 * @param {HTMLElement} box
 * @param {Set<string>} hidden
 */
export function showPressed(box, hidden) {
  for (const button of box.querySelectorAll("button.legend-entry")) {
    if (button instanceof HTMLElement) button.setAttribute("aria-pressed", String(!hidden.has(button.dataset.key ?? "")));
  }
}

/**
 * A line's stroke (a bar's square) in the entry's colour, as plotly's legend draws it.
 * @param {LegendEntry} entry
 */
function sample(entry) {
  const mark = entry.bar
    ? svgNode("rect", { x: 9, y: 0, width: 12, height: 12, fill: entry.color })
    : svgNode("line", {
        x1: 0,
        x2: 30,
        y1: 6,
        y2: 6,
        stroke: entry.color,
        "stroke-width": Math.min(entry.width, 3),
        "stroke-dasharray": dashArray(entry.dash, entry.width) ?? "none",
      });
  const svg = svgNode("svg", { width: 30, height: 12, viewBox: "0 0 30 12", "aria-hidden": "true" });
  svg.append(mark);
  return svg;
}
