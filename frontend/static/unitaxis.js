// @ts-check
// A y axis whose unit takes the number's SI prefix ("50 GB", "7.5 mJ"): plotly's d3 formats put
// the prefix on the number and a ticksuffix after it ("50G B"), so such an axis gets its ticks
// from here, written by format.js's display() like every other number of the pages.

import { display } from "./format.js";

const TICKS = 5; // about as many as plotly draws on a chart of this height

// 1, 2 or 5 times a power of ten, the first at least `raw`.
/** @param {number} raw */
function niceStep(raw) {
  const power = 10 ** Math.floor(Math.log10(raw));
  return /** @type {number} */ ([1, 2, 5, 10].map((m) => m * power).find((step) => step >= raw));
}

/**
 * @param {number} lo
 * @param {number} hi
 */
function linearValues(lo, hi) {
  const step = niceStep((hi - lo) / TICKS || Math.abs(hi) || 1);
  const values = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) values.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  return values;
}

// Powers of ten over the range, with their 2× and 5× where it spans less than three of them.
/**
 * @param {number} lo
 * @param {number} hi
 */
function logValues(lo, hi) {
  const decades = [];
  for (let k = Math.floor(Math.log10(lo)); k <= Math.ceil(Math.log10(hi)); k++) decades.push(10 ** k);
  const values = decades.length > 3 ? decades : decades.flatMap((d) => [d, 2 * d, 5 * d]);
  return values.filter((v) => v >= lo && v <= hi);
}

// Tick values and texts of a y axis over [lo, hi] (data units; on a log axis, lo > 0).
/**
 * @param {Metric} metric
 * @param {number} lo
 * @param {number} hi
 */
export function unitTicks(metric, lo, hi, log = false) {
  if (!Number.isFinite(lo) || !Number.isFinite(hi) || (log && hi <= 0)) return { tickmode: "auto" };
  const tickvals = log ? logValues(Math.max(lo, hi * 1e-12), hi) : linearValues(lo, hi);
  const trimmed = { ...metric, format: metric.format.replace(/([a-z%])$/, "~$1") };
  return { tickmode: "array", tickvals, ticktext: tickvals.map((v) => display(trimmed, v)) };
}

// The y extent of the traces' values: what plotly's autorange shows (from 0 where the axis starts there).
/**
 * @param {{ y?: unknown[] }[]} traces
 * @param {boolean} fromZero
 * @returns {[number, number]}
 */
export function yExtent(traces, fromZero) {
  let [lo, hi] = fromZero ? [0, 0] : [Infinity, -Infinity];
  for (const t of traces) {
    for (const y of t.y || []) {
      if (typeof y === "number" && Number.isFinite(y)) [lo, hi] = [Math.min(lo, y), Math.max(hi, y)];
    }
  }
  return [lo, hi];
}
