// @ts-check
// A heatmap figure (one "heatmap" trace: numbers on x, categories on y, a row of z per category,
// its colour scale given as stops, a colorbar) drawn as a still SVG at the size of the element
// that plotly's chart will take: the cells in their colours on the scale (colorscale.js), painted
// on a canvas, the x and y axes, and the colorbar. The Ranks panel shows it while plotly.js loads
// (ranks_sketch.js); plotly's chart replaces it (ChartPanel.draw).
// Cells sit where plotly puts them: each x the centre of a brick whose edges lie halfway to its
// neighbours (the outer two as far out again), the x axis exactly over the bricks; category k
// spans k ± 0.5, the first at the bottom; the colours span the finite z values.

import { cellColors, valueRange } from "./colorscale.js";
import { svgNode as node } from "./dom.js";
import { axisOf, niceTicks, numberLabel, sketchSvg } from "./sketch.js";

// Plotly's colorbar, as ranks_figures.js sets it: 10 px of padding around a bar 12 px wide, its
// tick labels right of it, its title above it; placed a fiftieth of the plot's width past it.
const BAR = { pad: 10, gap: 4, title: 22, past: 0.02 };

// The edges of the bricks centred on xs (one more than xs).
/** @param {number[]} xs */
export function brickEdges(xs) {
  const n = xs.length;
  if (n === 1) return [xs[0] - 0.5, xs[0] + 0.5];
  return [1.5 * xs[0] - 0.5 * xs[1], ...xs.slice(1).map((x, i) => (xs[i] + x) / 2), 1.5 * xs[n - 1] - 0.5 * xs[n - 2]];
}

// Every how many of n categories one is labelled, on an axis `length` px long: room for a label
// every 15 px (a line of 12 px text), as plotly thins a crowded category axis.
/**
 * @param {number} n
 * @param {number} length
 */
export const categoryStep = (n, length) => Math.ceil(Math.max(n / (length / 15), 1));

// The colours' range: the finite z values', widened by half on each side where they are all equal
// (plotly's), [0, 1] where there are none.
/** @param {(number | null)[][]} z */
export function colorRange(z) {
  const range = valueRange(z);
  if (!range) return /** @type {[number, number]} */ ([0, 1]);
  return /** @type {[number, number]} */ (range[0] === range[1] ? [range[0] - 0.5, range[1] + 0.5] : range);
}

const round = (/** @type {number} */ v) => Math.round(v * 100) / 100;

// Draws the heatmap `trace` under `layout` into `element` (emptied first) as one
// <svg class="sketch" role="img">; label: what a screen reader hears. Returns the svg.
export function drawHeatmapSketch(element, trace, layout, { label }) {
  const { svg, width, height, margin } = sketchSvg(element, layout, label);
  const top = margin.t;
  const plotHeight = height - top - margin.b;
  const categories = trace.y;
  const rowHeight = plotHeight / categories.length;
  const rowTop = (/** @type {number} */ k) => round(top + plotHeight - (k + 1) * rowHeight);

  // The y labels decide the left margin, the colorbar's labels and title the right one.
  const step = categoryStep(categories.length, plotHeight);
  const yLabels = categories
    .map((text, k) => [k, text])
    .filter(([k]) => k % step === 0)
    .map(([k, text]) => svg.appendChild(node("text", { x: 0, y: round(rowTop(k) + rowHeight / 2), "text-anchor": "end", "dominant-baseline": "central" }, text)));
  const left = Math.max(margin.l, Math.max(0, ...yLabels.map((t) => t.getComputedTextLength())) + 6);
  yLabels.forEach((text) => text.setAttribute("x", String(left - 4)));

  const zRange = colorRange(trace.z);
  const span = zRange[1] - zRange[0];
  const barTop = top + BAR.title;
  const barHeight = plotHeight - BAR.title - BAR.pad;
  const zTicks = niceTicks(zRange[0], zRange[1], Math.max(3, Math.min(10, barHeight / 40))).filter((v) => v >= zRange[0] - span * 1e-9 && v <= zRange[1] + span * 1e-9);
  const barTitle = svg.appendChild(node("text", { "dominant-baseline": "central" }, trace.colorbar?.title?.text ?? ""));
  const zLabels = zTicks.map((v) => svg.appendChild(node("text", { "dominant-baseline": "central" }, numberLabel(undefined, v, zTicks))));
  const thickness = trace.colorbar?.thickness ?? 30;
  const barWidth = Math.max(thickness + BAR.gap + Math.max(0, ...zLabels.map((t) => t.getComputedTextLength())), barTitle.getComputedTextLength());
  const plotWidth = (width - left - Math.max(margin.r, barWidth + 2 * BAR.pad)) / (1 + BAR.past);
  const barLeft = round(left + plotWidth * (1 + BAR.past) + BAR.pad);

  const edges = brickEdges(trace.x);
  const xAxis = axisOf(layout.xaxis ?? {}, edges, { length: plotWidth, isY: false });
  const [x0, x1] = xAxis.range;
  const px = (/** @type {number} */ v) => round(left + ((v - x0) / (x1 - x0)) * plotWidth);
  svg.dataset.xRange = xAxis.range.join(" ");
  svg.dataset.zRange = zRange.join(" ");
  svg.append(node("rect", { class: "plot-area", x: left, y: top, width: round(plotWidth), height: plotHeight, fill: "none" }));
  const inRange = (/** @type {number} */ v) => v >= x0 && v <= x1;
  const xTicks = xAxis.ticks.values.map((v, i) => [v, xAxis.ticks.labels[i]]).filter(([v]) => inRange(Number(v)));
  const gridColor = layout.xaxis?.gridcolor;
  svg.append(...xTicks.map(([v]) => node("line", { x1: px(Number(v)), x2: px(Number(v)), y1: top, y2: top + plotHeight, stroke: gridColor, "stroke-width": 1 })));

  // The cells on one canvas (a rect each would be thousands of nodes: 64 ranks by 200 intervals),
  // their edges on whole device pixels, so that neighbours meet without seams.
  const dpr = window.devicePixelRatio || 1;
  const canvas = document.createElement("canvas");
  canvas.className = "cells";
  Object.assign(canvas, { width: Math.round(plotWidth * dpr), height: Math.round(plotHeight * dpr) });
  Object.assign(canvas.style, { display: "block", width: `${plotWidth}px`, height: `${plotHeight}px` });
  const context = canvas.getContext("2d");
  const xEdges = edges.map((e) => Math.round((px(e) - left) * dpr));
  const yEdge = (/** @type {number} */ k) => Math.round((plotHeight - k * rowHeight) * dpr); // row k's lower edge
  const colorOf = cellColors(trace.colorscale, zRange);
  trace.z.forEach((row, k) => {
    row.forEach((value, i) => {
      const fill = colorOf(value);
      if (fill === null) return; // plotly leaves a missing value's cell empty
      context.fillStyle = fill;
      context.fillRect(xEdges[i], yEdge(k + 1), xEdges[i + 1] - xEdges[i], yEdge(k) - yEdge(k + 1));
    });
  });
  const cells = svg.appendChild(node("foreignObject", { x: left, y: top, width: plotWidth, height: plotHeight }));
  cells.append(canvas);

  svg.append(...xTicks.map(([v, text]) => node("text", { x: px(Number(v)), y: top + plotHeight + 18, "text-anchor": "middle" }, String(text))));
  svg.append(node("text", { x: left + plotWidth / 2, y: height - 3, "text-anchor": "middle", "font-size": 14 }, layout.xaxis?.title?.text ?? ""));

  // The colorbar: the scale as a gradient (SVG mixes stops in sRGB, as the cells are), bottom up.
  const gradientId = `${element.closest("[id]")?.id ?? "heatmap"}-scale`;
  const gradient = node("linearGradient", { id: gradientId, x1: 0, y1: 1, x2: 0, y2: 0 });
  gradient.append(...trace.colorscale.map(([offset, color]) => node("stop", { offset, "stop-color": color })));
  const defs = node("defs");
  defs.append(gradient);
  svg.append(defs, node("rect", { class: "colorbar", x: barLeft, y: barTop, width: thickness, height: barHeight, fill: `url(#${gradientId})`, stroke: "#444", "stroke-width": 1 }));
  const barY = (/** @type {number} */ v) => round(barTop + barHeight - ((v - zRange[0]) / (zRange[1] - zRange[0])) * barHeight);
  zLabels.forEach((text, i) => {
    text.setAttribute("x", String(barLeft + thickness + BAR.gap));
    text.setAttribute("y", String(barY(zTicks[i])));
  });
  barTitle.setAttribute("x", String(barLeft));
  barTitle.setAttribute("y", String(top + BAR.title / 2));
  return svg;
}
