// @ts-check
// What the run page's Ranks panel shows of a ranks answer (GET /api/v1/runs/{id}/ranks): its two
// figures (plotly traces and layout) and its line on the latest interval. One definition for
// plotly's charts (ranks.js) and the stills drawn before plotly.js has loaded (ranks_sketch.js).

import { COLORS, STEP_TIME_SCALE } from "./colors.js";
import { fill, layout, line } from "./charts.js";
import { display, formatNumber, unitSuffix } from "./format.js";

// The spread has no catalogue entry (it is not a ratio of additive sums); its label lives here.
export const SPREAD = { name: "spread", label: "slowest ÷ median", unit: "×", format: ".3f" };

// The per-interval lines drawn where the answer has no matrix: the catalogue's step time format.
export const QUANTILES = [
  ["slowest_s", "slowest rank", COLORS.overcount, "solid"],
  ["p90_s", "90th percentile", COLORS.baseline, "dash"],
  ["median_s", "median", COLORS.thd, "solid"],
  ["fastest_s", "fastest rank", COLORS.useful, "dot"],
];

// The step-time chart: each rank's step time per interval (a rank × step heatmap) where the answer
// has the matrix, else the slowest, 90th percentile, median and fastest of each interval. title and
// note: the card's, where they differ from the template's (null: the template's).
// stepTime: the catalogue's step_time_s metric (its format and unit).
export function stepTimeFigure(ranks, stepTime) {
  if (!ranks.matrix) {
    const traces = QUANTILES.map(([column, name, color, dash]) => line(column, stepTime, color, { name, dash }));
    return {
      title: "Step time over the ranks",
      note: `${ranks.rank_count} ranks: the slowest, 90th percentile, median and fastest of each interval (GPU time ÷ steps of each rank's record)`,
      traces: fill(traces, ranks),
      layout: layout({ yTitle: "s/step", metric: stepTime, fromZero: false }),
    };
  }
  const trace = {
    type: "heatmap",
    x: ranks.step,
    y: ranks.ranks.map((r) => `rank ${r}`),
    z: ranks.step_time_s,
    colorscale: STEP_TIME_SCALE,
    colorbar: { title: { text: "s/step" }, thickness: 12 },
    hovertemplate: `%{y}, step %{x}: %{z:${stepTime.format}}${unitSuffix(stepTime)}<extra></extra>`,
    meta: { kind: "heatmap" },
  };
  return {
    title: null,
    note: null,
    traces: [trace],
    layout: { ...layout({ yTitle: "" }), hovermode: "closest", yaxis: { type: "category", automargin: true } },
  };
}

// The straggler spread (slowest rank ÷ median) per interval. No fixed tick format: spreads of
// 1.000–1.012 need three decimals, which plotly picks from the tick step (".2f" labelled five
// ticks "1.01 1.01 1.01 1.00 1.00").
export function spreadFigure(ranks) {
  return {
    traces: fill([line("spread", SPREAD, COLORS.overcount)], ranks),
    layout: { ...layout({ yTitle: SPREAD.label, yFormat: "", fromZero: false }), showlegend: false },
  };
}

// The newest interval every rank has sent: a partial one would name a slowest rank too early.
function latestComplete(ranks) {
  for (let i = ranks.interval.length - 1; i >= 0; i--) {
    if (ranks.reporting_ranks[i] === ranks.rank_count) return i;
  }
  return null;
}

// The panel's line on the slowest ranks of the latest complete interval.
export function latestText(ranks, stepTime) {
  const i = latestComplete(ranks);
  if (i === null) return "Waiting for an interval that every rank has sent…";
  const slowest = ranks.slowest_rank[i];
  const next = ranks.slowest_ranks[i].slice(1, 4);
  return (
    `Latest interval (step ${ranks.step[i]}): rank ${slowest} is slowest at ${display(stepTime, ranks.slowest_s[i])}` +
    ` per step, ${formatNumber(SPREAD.format, ranks.spread[i])}× the median of ${display(stepTime, ranks.median_s[i])}` +
    (next.length ? `; then ranks ${next.join(", ")}.` : ".")
  );
}
