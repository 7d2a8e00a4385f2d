// @ts-check
// The run page's first module. The page's head has asked for its first answers (preloads, taken
// here by fetchEarly's requests for the same paths) and for plotly.js (its partial cartesian
// bundle, 1.5 MB: an async script, fetched and compiled off the main thread meanwhile). This
// draws the headline chart from the answers as a still SVG (first_chart.js), and the Ranks
// panel's two charts for a run of several ranks (ranks_sketch.js), unless plotly.js has already
// run; plotly's charts replace the drawings.
// run.js's calls for the same paths take these answers (api.js), and it waits for plotlyLoaded.

import { fetchEarly, paths } from "./api.js";
import { SERIES_POINTS } from "./run_sizes.js";

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

// plotly.js is asked by the page's head (an async script): Chromium fetches it and compiles it off
// the main thread while the page waits for its first answers; running it holds the main thread.
// The mark is when it ran, or when this module found it had.
const plotlyRan = new Promise((resolve, reject) => {
  const ran = () => {
    performance.mark("plotly-ran"); // bench/browser_timing.py's breakdown reads the page's marks
    resolve(undefined);
  };
  if ("Plotly" in globalThis) return ran();
  const script = document.querySelector(`script[src="${PLOTLY_JS}"]`);
  script.addEventListener("load", ran);
  script.addEventListener("error", () => reject(new Error(`${PLOTLY_JS} did not load`)));
});

// Each drawing's own module loads beside the answers, not before them. A drawing that fails is
// reported and skipped: plotly.js loads whatever becomes of it.
const drawn = (module, draw, what) =>
  import(module)
    .then(draw)
    .catch((error) => console.error(`the first drawing of ${what} failed:`, error));
const drawings = [drawn("./first_chart.js", ({ drawFirstChart }) => drawFirstChart(runId), "the headline chart")];
if (severalRanks) drawings.push(drawn("./ranks_sketch.js", ({ drawRanksSketch }) => drawRanksSketch(runId), "the ranks panel"));
// run.js draws once plotly.js has run and the drawings are done, each given a frame to be painted
// in before plotly's charts replace it; or at once once plotly.js has run before them: a drawing
// not done by then draws nothing (each checks for Plotly before it draws), so none is waited for.
const drawingsDone = Promise.all(drawings).then(painted);
export const plotlyLoaded = Promise.all([plotlyRan, Promise.race([drawingsDone, plotlyRan])]);
