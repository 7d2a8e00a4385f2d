// @ts-check
// The Ranks panel's first drawing: from the early ranks answer (asked for by run_early.js for a
// run of several ranks), its two charts as stills before plotly.js has loaded: the step time per
// rank as heatmap_sketch.js's heatmap (or sketch.js's lines of the slowest, 90th percentile,
// median and fastest rank past 64 ranks) and the straggler spread as sketch.js's line, in the
// boxes that plotly's charts take over (ranks.js); the panel shows itself with them. The figures
// are the ones ranks.js hands plotly (ranks_figures.js).

import { peekEarly, paths } from "./api.js";
import { loadCatalogue, metricOf } from "./catalogue.js";
import { drawHeatmapSketch } from "./heatmap_sketch.js";
import { latestText, spreadFigure, stepTimeFigure } from "./ranks_figures.js";
import { drawSketch } from "./sketch.js";

const STILL = "a still drawing; the interactive chart is loading";

const hasPoints = (traces) => traces.some((t) => t.y.some((v) => typeof v === "number" && Number.isFinite(v)));

// A chart card made ready for its still: its note kept for ChartPanel (as first_chart.js keeps
// the headline's), shown, and its plot box returned.
function cardFor(id, { title = null, note = null } = {}) {
  const card = document.getElementById(id);
  const noteNode = /** @type {HTMLElement} */ (card.querySelector(".card-head .note"));
  noteNode.dataset.base ??= noteNode.textContent.trim();
  if (title) card.querySelector("h2").textContent = title;
  if (note) noteNode.textContent = note;
  card.classList.remove("is-empty"); // before measuring: an empty card hides its plot
  return /** @type {HTMLElement} */ (card.querySelector(".plot"));
}

// True once drawn; false where there is nothing to draw (one rank answered) or an answer failed
// (ranks.js asks again and reports it).
export async function drawRanksSketch(runId) {
  let catalogue;
  let ranks;
  try {
    [catalogue, ranks] = await Promise.all([loadCatalogue(), peekEarly(paths.ranks(runId))]);
  } catch {
    return false;
  }
  if (!ranks || ranks.rank_count < 2 || !ranks.step.length) return false;
  const stepTime = metricOf(catalogue, "step_time_s");
  const steps = stepTimeFigure(ranks, stepTime);
  const spread = spreadFigure(ranks);
  document.getElementById("ranks").hidden = false; // before measuring: a hidden plot has no size
  document.getElementById("ranks-latest").textContent = latestText(ranks, stepTime);
  const span = `steps ${ranks.step[0]}–${ranks.step.at(-1)}`;

  const stepsBox = cardFor("chart-rank_heatmap", steps);
  if (ranks.matrix) {
    const label = `Step time per rank: ${ranks.ranks.length} ranks by ${ranks.step.length} intervals, ${span}; darker is slower (${STILL})`;
    drawHeatmapSketch(stepsBox, steps.traces[0], steps.layout, { label });
  } else if (hasPoints(steps.traces)) {
    const label = `Step time over ${ranks.rank_count} ranks by step: ${steps.traces.map((t) => t.name).join(", ")}; ${span} (${STILL})`;
    drawSketch(stepsBox, steps.traces, steps.layout, { label });
  }
  const spreadBox = cardFor("chart-rank_spread");
  if (hasPoints(spread.traces)) drawSketch(spreadBox, spread.traces, spread.layout, { label: `Straggler spread, slowest rank ÷ median, by step; ${span} (${STILL})` });
  return true;
}
