// @ts-check
// The run page's first drawing: its headline chart from the early answers (the catalogue and the
// series, asked for by run_early.js), as the still SVG of sketch.js, in the box that plotly's chart
// takes over once plotly.js has loaded. The figure is the one run.js hands plotly: the same
// traces filled from the same answer, under the same settings (x axis, log y, smoothing).

import { peekEarly, paths } from "./api.js";
import { loadCatalogue, metricOf } from "./catalogue.js";
import { chartNote, fill, seriesFigure } from "./charts.js";
import { X_AXES, readSettings, xColumns } from "./controls.js";
import { HEADLINE, headlineChart } from "./run_headline.js";
import { SERIES_POINTS } from "./run_sizes.js";
import { drawSketch } from "./sketch.js";

// True once drawn; false where there is nothing to draw yet or an answer failed (run.js reports it).
export async function drawFirstChart(runId) {
  let catalogue;
  let series;
  try {
    [catalogue, series] = await Promise.all([loadCatalogue(), peekEarly(paths.series(runId, { max_points: SERIES_POINTS }))]);
  } catch {
    return false;
  }
  if (!series?.points) return false;
  const settings = readSettings();
  const chart = headlineChart((name) => metricOf(catalogue, name));
  const columns = { ...series.columns, ...xColumns(series) };
  const lines = chart.traces.filter((t) => t.meta.kind === "line").map((t) => t.meta.column);
  if (!lines.some((name) => columns[name]?.some((v) => v !== null))) return false; // run.js shows why
  const { traces, layout } = seriesFigure(fill(chart.traces, columns, X_AXES[settings.x].column), chart.layout, settings);

  const card = document.getElementById(`chart-${HEADLINE}`);
  const note = /** @type {HTMLElement} */ (card.querySelector(".card-head .note"));
  note.dataset.base ??= note.textContent.trim();
  note.textContent = chartNote(note.dataset.base, traces);
  card.classList.remove("is-empty"); // before measuring: an empty card hides its plot
  const names = traces.filter((t) => t.meta.kind !== "band" && t.showlegend !== false).map((t) => t.name);
  const label = `${layout.yaxis.title.text} by ${layout.xaxis.title.text}: ${names.join(", ")}; ${series.points} points (a still drawing; the interactive chart is loading)`;
  drawSketch(card.querySelector(".plot"), traces, layout, { label });
  performance.mark("still-drawn"); // read by bench/browser_timing.py
  return true;
}
