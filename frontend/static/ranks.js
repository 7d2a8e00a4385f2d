// @ts-check
// The run page's Ranks panel: each rank's step time (a rank × step heatmap) where the server sends
// every rank's (runs of up to 64 ranks), else the step time's spread over the ranks per interval
// (slowest, 90th percentile, median, fastest, from the rank summaries kept at ingest); the
// straggler spread (slowest rank ÷ median) per interval, and the slowest ranks of the latest
// interval. Asked for only where the run's first interval came from two or more ranks
// (RunSummary.ranks; GET /api/v1/runs/{id}/ranks).

import { getRanks } from "./api.js";
import { ChartPanel } from "./charts.js";
import { csvLink, tracesToCSV } from "./csv.js";
import { QUANTILES, latestText, spreadFigure, stepTimeFigure } from "./ranks_figures.js";

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
    this.heatmap = new ChartPanel(heatmapBox, { filename: `${runId}-ranks.csv` });
    this.heatmapNote = this.heatmap.baseNote; // the template's (the still may have changed the text)
    // A heatmap has no x/y traces for the generic CSV: one column per rank instead.
    this.heatmap.element.querySelector(".chart-foot").replaceChildren(csvLink(`${runId}-ranks.csv`, () => this.csv()));
    this.spread = new ChartPanel(document.getElementById("chart-rank_spread"), { filename: `${runId}-rank-spread.csv` });
  }

  // run: the RunSummary; a run whose first interval came from one rank asks nothing. The first
  // load takes the answer run_early.js asked for, which ranks_sketch.js has drawn as a still.
  async load(run) {
    if ((run?.ranks ?? 0) < 2) {
      this.section.hidden = true;
      return;
    }
    const ranks = await getRanks(this.runId);
    this.data = ranks;
    this.section.hidden = ranks.rank_count < 2;
    if (this.section.hidden) return; // a hidden plot has no size to draw into
    const steps = stepTimeFigure(ranks, this.stepTime);
    if (steps.title) this.heatmapTitle.textContent = steps.title;
    this.heatmap.baseNote = steps.note ?? this.heatmapNote; // ChartPanel.draw writes it
    this.heatmap.draw(steps.traces, steps.layout);
    const spread = spreadFigure(ranks);
    this.spread.draw(spread.traces, spread.layout);
    this.latest.textContent = latestText(ranks, this.stepTime);
  }

  csv() {
    const d = this.data;
    if (!d) return "";
    if (!d.matrix) return tracesToCSV(QUANTILES.map(([column]) => ({ x: d.step, y: d[column], meta: { csv: column } })), "step");
    const traces = d.ranks.map((r, k) => ({ x: d.step, y: d.step_time_s[k], meta: { csv: `rank_${r}_step_time_s` } }));
    return tracesToCSV(traces, "step");
  }
}
