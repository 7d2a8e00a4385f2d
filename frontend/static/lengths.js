// @ts-check
// The run page's length histograms: a heatmap of the length distribution over the run (one column
// per shown interval, GET /histograms/over-time) and the bars of one interval, picked with a
// slider or by clicking a heatmap column (GET /histograms?interval=N).

import * as api from "./api.js";
import { ChartPanel, layout } from "./charts.js";
import { SHARE_SCALE } from "./colors.js";
import { csvLink, tracesToCSV } from "./csv.js";
import { showError } from "./dom.js";
import { bucketLabels, histogramTraces } from "./histogram.js";
import { emptyText } from "./run_facts.js";
import { HEATMAP_COLUMNS } from "./run_sizes.js";

const PICK_DEBOUNCE_MS = 150;
const KIND_NOUN = { documents: "documents", packs: "packs" };

// Each column's share of its own total per bucket (null where the column is empty).
export function shares(rows) {
  return rows.map((row) => {
    const total = row.reduce((a, b) => a + b, 0);
    return row.map((value) => (total ? value / total : null));
  });
}

// Rows [column][bucket] as plotly's z [bucket][column], kept to the buckets any column uses.
function transposed(rows, labels) {
  const used = labels.map((_, b) => rows.some((row) => row[b] > 0));
  const first = used.indexOf(true);
  const last = used.lastIndexOf(true);
  if (first < 0) return { y: [], z: [] };
  const buckets = labels.map((_, b) => b).slice(first, last + 1);
  return { y: buckets.map((b) => labels[b]), z: buckets.map((b) => rows.map((row) => row[b])) };
}

export class LengthsPanel {
  constructor(runId) {
    this.runId = runId;
    this.heat = new ChartPanel(document.getElementById("chart-length_heatmap"), { filename: `${runId}-lengths.csv`, linked: false });
    this.heat.element.querySelector(".chart-foot").replaceChildren(csvLink(`${runId}-lengths.csv`, () => this.csv()));
    this.bars = new ChartPanel(document.getElementById("chart-histogram"), { filename: `${runId}-histogram.csv`, xName: "length_bucket", linked: false });
    this.kind = /** @type {HTMLSelectElement} */ (document.getElementById("heat-kind"));
    this.weight = /** @type {HTMLSelectElement} */ (document.getElementById("heat-weight"));
    this.slider = /** @type {HTMLInputElement} */ (document.getElementById("hist-interval"));
    this.picked = document.getElementById("hist-picked");
    this.columns = null;
    this.following = true; // the bars show the latest interval until the user picks another
    this.interval = null;
    this.kind.addEventListener("change", () => this.drawHeat());
    this.weight.addEventListener("change", () => this.drawHeat());
    let timer = null;
    this.slider.addEventListener("input", () => {
      this.following = Number(this.slider.value) === this.columns?.last_interval;
      this.picked.textContent = `interval ${this.slider.value}`;
      clearTimeout(timer);
      timer = setTimeout(() => this.pick(Number(this.slider.value)).catch(showError), PICK_DEBOUNCE_MS);
    });
  }

  async load(run) {
    if (!run.records) {
      this.clickable = false;
      this.heat.showEmpty(emptyText(run));
      this.bars.showEmpty(emptyText(run));
      return;
    }
    this.columns = await api.getHistogramColumns(this.runId, HEATMAP_COLUMNS);
    const { first_interval: first, last_interval: last } = this.columns;
    Object.assign(this.slider, { min: first, max: last, disabled: first === last });
    this.drawHeat();
    if (this.following || this.interval === null) await this.pick(last);
  }

  async pick(interval) {
    this.interval = interval;
    this.slider.value = String(interval);
    let histogram;
    try {
      histogram = await api.getHistograms(this.runId, interval);
    } catch (error) {
      if (/** @type {{ status?: number }} */ (error).status !== 404) throw error;
      this.picked.textContent = `interval ${interval}`;
      return this.bars.showEmpty(`Interval ${interval} is not stored (the run did not send it).`);
    }
    if (interval !== this.interval) return; // a later pick answered first
    this.picked.textContent = `interval ${interval} · steps ${histogram.first_step}–${histogram.last_step}`;
    const traces = histogramTraces(histogram);
    if (!traces.length) return this.bars.showEmpty(`Interval ${interval} has no lengths recorded.`);
    this.bars.draw(traces, {
      ...layout({ yTitle: "tokens", xTitle: "length (tokens)", yFormat: "~s", barmode: "group", xType: "category" }),
      hovermode: "closest",
    });
  }

  drawHeat() {
    const data = this.columns;
    if (!data) return;
    const kind = this.kind.value;
    const part = this.weight.value;
    const labels = bucketLabels(data.edges);
    const { y, z } = transposed(shares(data[kind][part]), labels);
    if (!y.length) {
      this.clickable = false; // showEmpty purges the plot and its listeners
      return this.heat.showEmpty("No lengths recorded yet.");
    }
    const total = data.last_interval - data.first_interval + 1;
    const spread = data.intervals.length < total ? `${data.intervals.length} of ${total} intervals, evenly spread` : `all ${total} intervals`;
    const noun = part === "count" ? KIND_NOUN[kind] : `tokens in ${KIND_NOUN[kind]}`;
    // What a column is, said plainly: a sample of single intervals, not an aggregate of the gaps between them.
    this.heat.baseNote = `each column is one interval (all its ranks summed), not an aggregate: ${spread}; colour: share of ${noun} per length bucket`;
    const trace = {
      type: "heatmap",
      x: data.last_step,
      y,
      z,
      customdata: z.map(() => data.intervals),
      colorscale: SHARE_SCALE,
      // Shares run from none to all: a fixed scale, so all-100% cells read dark, not mid-scale.
      zmin: 0,
      zmax: 1,
      colorbar: { title: { text: "share" }, tickformat: ".0%", thickness: 12 },
      hovertemplate: `interval %{customdata}, last step %{x}<br>length %{y}: %{z:.1%} of ${noun}<extra></extra>`,
      meta: { kind: "heatmap" },
    };
    this.heat.draw([trace], {
      ...layout({ yTitle: "length (tokens)", xTitle: "step (each column: one interval, at its last step)" }),
      hovermode: "closest",
      yaxis: { type: "category", automargin: true, title: { text: "length (tokens)" } },
    });
    if (!this.clickable) {
      this.clickable = true;
      this.heat.plot.on("plotly_click", (event) => {
        const point = event.points?.[0];
        if (!point) return;
        this.following = false;
        this.pick(this.columns.intervals[point.pointNumber[1]]).catch(showError);
      });
    }
  }

  csv() {
    const data = this.columns;
    if (!data) return "";
    const labels = bucketLabels(data.edges);
    const rows = shares(data[this.kind.value][this.weight.value]);
    const traces = labels.map((label, b) => ({ x: data.intervals, y: rows.map((row) => row[b]), meta: { csv: `share_${label}` } }));
    return tracesToCSV(traces, "interval");
  }
}
