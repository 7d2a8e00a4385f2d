// @ts-check
// The run page's headline chart, TFLOP/s per GPU (useful vs per-document vs baseline, with their
// min–max bands): one definition for run.js's plotly chart and run_early.js's first drawing of it.

import { COLORS } from "./colors.js";
import { band, layout, line } from "./charts.js";

export const HEADLINE = "tflops"; // the chart card #chart-tflops

// Useful is drawn last and widest: it is the headline, and per-document nearly covers it
// otherwise; legendrank keeps the legend in reading order regardless of drawing order.
// m: metric name -> catalogue entry.
export function threeCounts(m, prefix, { bands = false } = {}) {
  /** @type {[string, string, { dash?: string, rank: number, width?: number }][]} */
  const counts = [
    ["bshd", COLORS.baseline, { dash: "dash", rank: 3 }],
    ["thd", COLORS.thd, { rank: 2 }],
    ["useful", COLORS.useful, { rank: 1, width: 2.5 }],
  ];
  const edges = bands ? counts.flatMap(([kind, color]) => band(`${prefix}_${kind}`, m(`${prefix}_${kind}`).label, color)) : [];
  return [...edges, ...counts.map(([kind, color, options]) => line(`${prefix}_${kind}`, m(`${prefix}_${kind}`), color, options))];
}

export const headlineChart = (m) => ({
  traces: threeCounts(m, "tflops", { bands: true }),
  layout: layout({ yTitle: "TFLOP/s per GPU", metric: m("tflops_useful") }),
});
