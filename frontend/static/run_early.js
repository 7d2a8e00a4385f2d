// @ts-check
// The run page's first module: asks for the page's first answers at once, draws the headline
// chart from them as a still SVG (first_chart.js), and the Ranks panel's two charts for a run of
// several ranks (ranks_sketch.js), and only then loads plotly.js (its partial cartesian bundle,
// 1.5 MB, whose compiling and running blocks the page meanwhile), whose charts replace the
// drawings.
// run.js's calls for the same paths take these answers (api.js), and it waits for plotlyLoaded.

import { fetchEarly, paths } from "./api.js";
import { HEATMAP_COLUMNS, SERIES_POINTS } from "./run_sizes.js";

// Not preloaded: on a first visit its 1.5 MB would be served beside the answers the drawing
// waits for, and delay them (docs/benchmarks/2026-11-30-2core.md#dev-2026-11-30-1516-first-drawing);
// later visits take it from the HTTP cache.
export const PLOTLY_JS = "/vendor/plotly.min.js";

const { runId, records, ranks } = document.getElementById("run").dataset;
const first = [paths.catalogue(), paths.run(runId), paths.series(runId, { max_points: SERIES_POINTS })];
// A run without intervals has no heatmap yet (404); the page asks once they arrive. The ranks
// only for a run whose first interval came from several ranks, as ranks.js asks (RunSummary.ranks).
const severalRanks = Number(ranks) > 1;
const heatmap = Number(records) > 0 ? [paths.histogramColumns(runId, HEATMAP_COLUMNS)] : [];
fetchEarly([...first, ...heatmap, ...(severalRanks ? [paths.ranks(runId)] : [])]);

// Resolves once what was drawn has had a frame to be painted in (or after 100 ms: a hidden tab
// has no frames).
export const painted = () =>
  new Promise((resolve) => {
    requestAnimationFrame(() => setTimeout(resolve));
    setTimeout(resolve, 100);
  });

function loadScript(src) {
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = src;
    script.onload = () => {
      performance.mark("plotly-ran"); // bench/browser_timing.py's breakdown reads the page's marks
      resolve();
    };
    script.onerror = () => reject(new Error(`${src} did not load`));
    document.head.append(script);
  });
}

// Each drawing's own module loads beside the answers, not before them. A drawing that fails is
// reported and skipped: plotly.js loads whatever becomes of it.
const drawn = (module, draw, what) =>
  import(module)
    .then(draw)
    .catch((error) => console.error(`the first drawing of ${what} failed:`, error));
const drawings = [drawn("./first_chart.js", ({ drawFirstChart }) => drawFirstChart(runId), "the headline chart")];
if (severalRanks) drawings.push(drawn("./ranks_sketch.js", ({ drawRanksSketch }) => drawRanksSketch(runId), "the ranks panel"));
export const plotlyLoaded = Promise.all(drawings)
  .then(painted)
  .then(() => {
    performance.mark("plotly-asked");
    return loadScript(PLOTLY_JS);
  });
