// Loaded before plotly.js (both deferred, so in document order): asks for the run page's first
// answers while the 4.5 MB bundle compiles, instead of after. run.js's calls for the same paths
// take these answers (api.js).

import { fetchEarly, paths } from "./api.js";
import { HEATMAP_COLUMNS, SERIES_POINTS } from "./run_sizes.js";

const { runId, records } = document.getElementById("run").dataset;
const first = [paths.catalogue(), paths.run(runId), paths.series(runId, { max_points: SERIES_POINTS })];
// A run without intervals has no heatmap yet (404); the page asks once they arrive.
fetchEarly(Number(records) > 0 ? [...first, paths.histogramColumns(runId, HEATMAP_COLUMNS)] : first);
