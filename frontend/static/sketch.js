// @ts-check
// A series figure (charts.js's line and "tonexty" band traces with their layout) drawn as a still
// SVG: grid, ticks, axis titles, shaded bands and lines, at the size of the element that plotly's
// chart will take, with the chart's legend above that element (chart_legend.js, as ChartPanel
// draws it). The run page shows it while plotly.js loads (run_early.js); plotly's
// chart replaces it (ChartPanel.draw). No hover, zoom or resize: it lives for about a second.
// heatmap_sketch.js draws the Ranks panel's heatmap with the nodes, ticks and axes exported here.
// Every vertex is a point of the figure's traces, on axes ranged as plotly ranges lines: x exactly
// over the data, y padded 5% of its length beyond the data (not below zero with rangemode "tozero").

import { dashArray, drawLegend, legendBox, legendEntries } from "./chart_legend.js";
import { svgNode as node } from "./dom.js";
import { formatNumber } from "./format.js";
import { localTime } from "./timeaxis.js";

const PAD = 0.05;
const TIME_STEPS_S = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

const finite = (v) => typeof v === "number" && Number.isFinite(v);
const round = (v) => Math.round(v * 100) / 100;

// Plotly's d3 "~" trims insignificant trailing zeros: ".4~g" draws 400 as "400", not "400.0".
const trimZeros = (text) => text.replace(/\.(\d*?)0+(\D*)$/, (_, digits, rest) => (digits ? `.${digits}` : "") + rest);

export function numberLabel(spec, v, ticks) {
  if (spec) return spec.includes("~") ? trimZeros(formatNumber(spec.replace("~", ""), v)) : formatNumber(spec, v);
  // Plotly's default: SI suffixes ("2M") for large ticks, plain numbers otherwise.
  const large = Math.max(...ticks.map(Math.abs)) >= 1e4;
  return trimZeros(formatNumber(large ? "s" : "g", v));
}

// About `target` ticks on 1, 2 or 5 × 10^k; none over a range too narrow for doubles to step
// through (values equal but for their last bits, as a straggler spread of 1.0 can be).
export function niceTicks(lo, hi, target) {
  const raw = (hi - lo) / Math.max(target, 1);
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((f) => f * magnitude).find((s) => s >= raw * 0.999);
  const first = Math.ceil(lo / step - 1e-9);
  const count = Math.floor(hi / step + 1e-9) - first + 1;
  if (!(step > Math.max(Math.abs(lo), Math.abs(hi)) * 1e-12) || !(count > 0)) return [];
  return Array.from({ length: count }, (_, i) => Number(((first + i) * step).toPrecision(12)));
}

// Wall-clock ticks (ms) on whole local seconds, minutes or hours.
function timeTicks(lo, hi, target) {
  const span = (hi - lo) / 1000;
  const step = (TIME_STEPS_S.find((s) => span / s <= target) ?? 86400 * Math.ceil(span / 86400 / target)) * 1000;
  const offset = new Date(lo).getTimezoneOffset() * 60_000;
  const ticks = [];
  for (let v = Math.ceil((lo - offset) / step) * step + offset; v <= hi; v += step) ticks.push(v);
  const text = (v) => localTime(v / 1000);
  // Dates for days, hh:mm for minutes and hours, hh:mm:ss below.
  const [from, to] = step >= 86_400_000 ? [0, 10] : step >= 60_000 ? [11, 16] : [11, 19];
  return { values: ticks, labels: ticks.map((v) => text(v).slice(from, to)) };
}

// An axis of the layout: how its data maps to numbers, its range and its ticks.
export function axisOf(spec, values, { length, isY }) {
  const date = spec.type === "date";
  const log = spec.type === "log";
  const toNumber = (v) => {
    if (date) return typeof v === "string" ? Date.parse(v.replace(" ", "T")) : NaN; // local time, as plotly reads it
    if (!finite(v)) return NaN;
    return log ? (v > 0 ? Math.log10(v) : NaN) : v;
  };
  const numbers = values.map(toNumber).filter(Number.isFinite);
  let lo = Math.min(...numbers);
  let hi = Math.max(...numbers);
  if (isY) {
    const toZero = !log && spec.rangemode === "tozero";
    if (toZero) [lo, hi] = [Math.min(lo, 0), Math.max(hi, 0)];
    if (hi === lo) [lo, hi] = [lo - 1, hi + 1]; // one value: a unit either side, unpadded, as plotly
    else {
      const span = hi - lo;
      const padLo = toZero && lo === 0 ? 0 : PAD;
      const padHi = toZero && hi === 0 ? 0 : PAD;
      const full = span / (1 - padLo - padHi);
      [lo, hi] = [lo - padLo * full, hi + padHi * full];
    }
  } else if (hi === lo) [lo, hi] = [lo - 1, hi + 1];
  const target = Math.max(3, Math.min(10, length / (isY ? 40 : 80)));
  let ticks;
  if (spec.tickmode === "array") ticks = { values: spec.tickvals ?? [], labels: (spec.ticktext ?? []).map(String) };
  else if (date) ticks = timeTicks(lo, hi, target);
  else if (log) {
    const decades = niceTicks(lo, hi, target).filter(Number.isInteger);
    const values = decades.length >= 2 ? decades : niceTicks(10 ** lo, 10 ** hi, target).filter((v) => v > 0).map(Math.log10);
    ticks = { values, labels: values.map((v) => numberLabel(spec.tickformat, 10 ** v, values.map((u) => 10 ** u))) };
  } else {
    const values = niceTicks(lo, hi, target);
    ticks = { values, labels: values.map((v) => numberLabel(spec.tickformat, v, values)) };
  }
  ticks.labels = ticks.labels.map((text) => text + (spec.ticksuffix ?? ""));
  return { toNumber, range: [lo, hi], ticks };
}

// "M x y L x y …", a new "M" after each gap.
function linePath(points) {
  let d = "";
  let open = false;
  for (const p of points) {
    if (!p) open = false;
    else {
      d += `${open ? "L" : "M"}${p[0]} ${p[1]}`;
      open = true;
    }
  }
  return d;
}

// The area between two traces' points where both have one: plotly's fill "tonexty".
function bandPath(upper, lower) {
  let d = "";
  let run = [];
  const close = () => {
    if (run.length > 1) d += `M${run.map((i) => upper[i].join(" ")).join("L")}L${run.reverse().map((i) => lower[i].join(" ")).join("L")}Z`;
    run = [];
  };
  upper.forEach((p, i) => (p && lower[i] ? run.push(i) : close()));
  close();
  return d;
}

// A still's <svg class="sketch" role="img"> in `element` (emptied first), at the element's size and
// in the layout's font, with plotly's margins; label: what a screen reader hears.
export function sketchSvg(element, layout, label) {
  const width = element.clientWidth;
  const height = element.clientHeight;
  const font = layout.font ?? {};
  const svg = node("svg", {
    class: "sketch",
    role: "img",
    "aria-label": label,
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    "font-family": font.family ?? "sans-serif",
    "font-size": font.size ?? 12,
    fill: font.color ?? "currentColor",
  });
  element.replaceChildren(svg);
  return { svg, width, height, margin: { l: 64, r: 16, t: 8, b: 44, ...layout.margin } };
}

// Draws `traces` under `layout` into `element` (emptied first) as one <svg class="sketch" role="img">.
// label: what a screen reader hears. Returns the svg.
export function drawSketch(element, traces, layout, { label }) {
  drawLegend(legendBox(element), legendEntries(traces, layout), new Set());
  const { svg, width, height, margin } = sketchSvg(element, layout, label);
  const shown = traces.filter((t) => t.visible !== false);
  const top = margin.t;
  const plotHeight = height - top - margin.b;
  const yAxis = axisOf(layout.yaxis ?? {}, shown.flatMap((t) => t.y ?? []), { length: plotHeight, isY: true });
  // The y tick labels and title decide the left margin (plotly's automargin).
  const yLabels = yAxis.ticks.labels.map((text) => svg.appendChild(node("text", { "text-anchor": "end", "dominant-baseline": "central" }, text)));
  const left = Math.max(margin.l, Math.max(0, ...yLabels.map((t) => t.getComputedTextLength())) + 6 + 24);
  // Ticks are chosen for the width before the right margin grows to hold half the last label.
  let plotWidth = width - left - margin.r;
  const xAxis = axisOf(layout.xaxis ?? {}, shown.flatMap((t) => t.x ?? []), { length: plotWidth, isY: false });
  const last = xAxis.ticks.values.findLastIndex((v) => v <= xAxis.range[1]);
  if (last >= 0) {
    const probe = svg.appendChild(node("text", {}, xAxis.ticks.labels[last]));
    const overhang = probe.getComputedTextLength() / 2 - (1 - (xAxis.ticks.values[last] - xAxis.range[0]) / (xAxis.range[1] - xAxis.range[0])) * plotWidth;
    probe.remove();
    plotWidth -= Math.max(0, overhang + 5 - margin.r);
  }
  const px = (v) => round(left + ((v - xAxis.range[0]) / (xAxis.range[1] - xAxis.range[0])) * plotWidth);
  const py = (v) => round(top + plotHeight - ((v - yAxis.range[0]) / (yAxis.range[1] - yAxis.range[0])) * plotHeight);
  svg.dataset.xRange = xAxis.range.join(" ");
  svg.dataset.yRange = yAxis.range.join(" ");
  svg.append(node("rect", { class: "plot-area", x: left, y: top, width: plotWidth, height: plotHeight, fill: "none" }));

  const inRange = (axis) => (v) => v >= axis.range[0] && v <= axis.range[1];
  const grid = (axis, spec, at) => axis.ticks.values.filter(inRange(axis)).map((v) => node("line", { ...at(v), stroke: spec.gridcolor, "stroke-width": 1 }));
  svg.append(
    ...grid(yAxis, layout.yaxis ?? {}, (v) => ({ x1: left, x2: left + plotWidth, y1: py(v), y2: py(v) })),
    ...grid(xAxis, layout.xaxis ?? {}, (v) => ({ x1: px(v), x2: px(v), y1: top, y2: top + plotHeight })),
  );
  yLabels.forEach((text, i) => {
    const v = yAxis.ticks.values[i];
    if (!inRange(yAxis)(v)) text.remove();
    else Object.entries({ x: left - 6, y: py(v) }).forEach(([k, value]) => text.setAttribute(k, value));
  });
  xAxis.ticks.values.forEach((v, i) => {
    if (inRange(xAxis)(v)) svg.append(node("text", { x: px(v), y: top + plotHeight + 18, "text-anchor": "middle" }, xAxis.ticks.labels[i]));
  });
  const title = (spec) => spec?.title?.text ?? "";
  svg.append(node("text", { x: left + plotWidth / 2, y: height - 3, "text-anchor": "middle", "font-size": 14 }, title(layout.xaxis)));
  const yMid = top + plotHeight / 2;
  svg.append(node("text", { x: 22, y: yMid, "text-anchor": "middle", transform: `rotate(-90 22 ${yMid})`, "font-size": 14 }, title(layout.yaxis)));

  // Bands first, then lines, each in the figure's order; a "tonexty" trace fills to the one before it.
  const at = (x, y) => {
    const [a, b] = [xAxis.toNumber(x), yAxis.toNumber(y)];
    return Number.isFinite(a) && Number.isFinite(b) ? [px(a), py(b)] : null;
  };
  const points = shown.map((t) => (t.x ?? []).map((x, i) => at(x, t.y?.[i])));
  shown.forEach((t, i) => {
    if (t.fill !== "tonexty" || i === 0) return;
    svg.append(node("path", { class: "band", d: bandPath(points[i - 1], points[i]), fill: t.fillcolor, stroke: "none", "data-name": t.name }));
  });
  shown.forEach((t, i) => {
    const { color, width = 2, dash } = t.line ?? {};
    if (width === 0) return;
    const attributes = { class: "line", d: linePath(points[i]), fill: "none", stroke: color, "stroke-width": width, "stroke-linejoin": "round", "data-name": t.name };
    if (dash && dash !== "solid") attributes["stroke-dasharray"] = dashArray(dash, width);
    if (t.opacity !== undefined) attributes.opacity = t.opacity;
    svg.append(node("path", attributes));
  });
  return svg;
}
