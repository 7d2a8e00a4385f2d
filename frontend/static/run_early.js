// @ts-check
// The run page's first module. The page's head has asked for its first answers (preloads, taken
// here by fetchEarly's requests for the same paths). This draws the headline chart from them as a
// still SVG (first_chart.js), and the Ranks panel's two charts for a run of several ranks
// (ranks_sketch.js), and only then runs plotly.js (1.2 MB, scatter, bar and heatmap alone, whose
// running blocks the page meanwhile), whose charts replace the drawings. Run as an async script
// from the head, plotly.js ran before the still could be drawn on most first visits, and the
// first thing on screen came later (docs/benchmarks/2026-12-07-2core-cold.md).
// run.js's calls for the same paths take these answers (api.js), and it waits for plotlyLoaded.

import { fetchEarly, paths } from "./api.js";
import { SERIES_POINTS } from "./run_sizes.js";

// Fetched from the head's preload, asked after the answers the drawing waits for (the browser's
// six connections to the host take those first), so that only its run is left once the still is
// drawn: sooner on a first visit than asking for it then (docs/benchmarks/2026-12-07-2core-bundle.md).
export const PLOTLY_JS = "/vendor/plotly.min.js";

const { runId, ranks } = document.getElementById("run").dataset;
// The headline's answers only (run.html preloads the same paths): the heavier ones (the lengths
// heatmap, the ledger, the sync sites) are asked after the first chart, so that the server and
// the browser's connections serve these first. The ranks only for a run whose first interval came
// from several ranks, as ranks.js asks (RunSummary.ranks): its still is drawn from them.
const FIRST_PATHS = [paths.catalogue(), paths.run(runId), paths.series(runId, { max_points: SERIES_POINTS })];
const severalRanks = Number(ranks) > 1;
fetchEarly([...FIRST_PATHS, ...(severalRanks ? [paths.ranks(runId)] : [])]);

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
      resolve(undefined);
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
