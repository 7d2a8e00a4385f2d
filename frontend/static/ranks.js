// @ts-check
// The run page's Ranks panel: each rank's step time (a rank × step heatmap) where the server sends
// every rank's (runs of up to 64 ranks), else the step time's spread over the ranks per interval
// (slowest, 90th percentile, median, fastest, from the rank summaries kept at ingest); the
// straggler spread (slowest rank ÷ median) per interval, and the slowest ranks of the latest
// interval. Asked for only where the run's first interval came from two or more ranks
// (RunSummary.ranks; GET /api/v1/runs/{id}/ranks).

import { COLORS } from "./colors.js";
import { ChartPanel, fill, layout, line } from "./charts.js";
import { csvLink, tracesToCSV } from "./csv.js";
import { display, formatNumber, unitSuffix } from "./format.js";

const MAX_POINTS = 200;
// The spread has no catalogue entry (it is not a ratio of additive sums); its label lives here.
const SPREAD = { name: "spread", label: "slowest ÷ median", unit: "×", format: ".3f" };

async function getRanks(runId) {
  const path = `/api/v1/runs/${encodeURIComponent(runId)}/ranks?max_points=${MAX_POINTS}`;
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) throw Object.assign(new Error(`GET ${path} answered HTTP ${response.status}`), { status: response.status });
  return response.json();
}

// The newest interval every rank has sent: a partial one would name a slowest rank too early.
function latestComplete(ranks) {
  for (let i = ranks.interval.length - 1; i >= 0; i--) {
    if (ranks.reporting_ranks[i] === ranks.rank_count) return i;
  }
  return null;
}

// The per-interval lines drawn where the answer has no matrix: the catalogue's step time format.
const QUANTILES = [
  ["slowest_s", "slowest rank", COLORS.overcount, "solid"],
  ["p90_s", "90th percentile", COLORS.baseline, "dash"],
  ["median_s", "median", COLORS.thd, "solid"],
  ["fastest_s", "fastest rank", COLORS.useful, "dot"],
];

export class RanksPanel {
  // stepTime: the catalogue's step_time_s metric (its format and unit label the heatmap).
  constructor(runId, stepTime) {
    this.runId = runId;
    this.stepTime = stepTime;
    this.section = document.getElementById("ranks");
    this.latest = document.getElementById("ranks-latest");
    this.data = null;
    const heatmapBox = document.getElementById("chart-rank_heatmap");
    this.heatmapTitle = heatmapBox.querySelector("h2");
    this.heatmapNote = heatmapBox.querySelector(".note");
    this.heatmap = new ChartPanel(heatmapBox, { filename: `${runId}-ranks.csv` });
    // A heatmap has no x/y traces for the generic CSV: one column per rank instead.
    this.heatmap.element.querySelector(".chart-foot").replaceChildren(csvLink(`${runId}-ranks.csv`, () => this.csv()));
    this.spread = new ChartPanel(document.getElementById("chart-rank_spread"), { filename: `${runId}-rank-spread.csv` });
  }

  // run: the RunSummary; a run whose first interval came from one rank asks nothing.
  async load(run) {
    if ((run?.ranks ?? 0) < 2) {
      this.section.hidden = true;
      return;
    }
    const ranks = await getRanks(this.runId);
    this.data = ranks;
    this.section.hidden = ranks.rank_count < 2;
    if (this.section.hidden) return; // a hidden plot has no size to draw into
    if (ranks.matrix) this.drawHeatmap(ranks);
    else this.drawQuantiles(ranks);
    // No fixed tick format: spreads of 1.000–1.012 need three decimals, which plotly picks from
    // the tick step (".2f" labelled five ticks "1.01 1.01 1.01 1.00 1.00").
    this.spread.draw(fill([line("spread", SPREAD, COLORS.overcount)], ranks), {
      ...layout({ yTitle: SPREAD.label, yFormat: "", fromZero: false }),
      showlegend: false,
    });
    this.describeLatest(ranks);
  }

  drawQuantiles(ranks) {
    this.heatmapTitle.textContent = "Step time over the ranks";
    this.heatmapNote.textContent = `${ranks.rank_count} ranks: the slowest, 90th percentile, median and fastest of each interval (GPU time ÷ steps of each rank's record)`;
    const traces = QUANTILES.map(([column, name, color, dash]) => line(column, this.stepTime, color, { name, dash }));
    this.heatmap.draw(fill(traces, ranks), layout({ yTitle: "s/step", metric: this.stepTime, fromZero: false }));
  }

  drawHeatmap(ranks) {
    const m = this.stepTime;
    const trace = {
      type: "heatmap",
      x: ranks.step,
      y: ranks.ranks.map((r) => `rank ${r}`),
      z: ranks.step_time_s,
      // Plotly's YlOrRd runs dark red at the low end: reversed, the slowest ranks are the dark ones.
      colorscale: "YlOrRd",
      reversescale: true,
      colorbar: { title: { text: "s/step" }, thickness: 12 },
      hovertemplate: `%{y}, step %{x}: %{z:${m.format}}${unitSuffix(m)}<extra></extra>`,
      meta: { kind: "heatmap" },
    };
    this.heatmap.draw([trace], { ...layout({ yTitle: "" }), hovermode: "closest", yaxis: { type: "category", automargin: true } });
  }

  describeLatest(ranks) {
    const i = latestComplete(ranks);
    if (i === null) {
      this.latest.textContent = "Waiting for an interval that every rank has sent…";
      return;
    }
    const slowest = ranks.slowest_rank[i];
    const next = ranks.slowest_ranks[i].slice(1, 4);
    this.latest.textContent =
      `Latest interval (step ${ranks.step[i]}): rank ${slowest} is slowest at ${display(this.stepTime, ranks.slowest_s[i])}` +
      ` per step, ${formatNumber(SPREAD.format, ranks.spread[i])}× the median of ${display(this.stepTime, ranks.median_s[i])}` +
      (next.length ? `; then ranks ${next.join(", ")}.` : ".");
  }

  csv() {
    const d = this.data;
    if (!d) return "";
    if (!d.matrix) return tracesToCSV(QUANTILES.map(([column]) => ({ x: d.step, y: d[column], meta: { csv: column } })), "step");
    const traces = d.ranks.map((r, k) => ({ x: d.step, y: d.step_time_s[k], meta: { csv: `rank_${r}_step_time_s` } }));
    return tracesToCSV(traces, "step");
  }
}
