// @ts-check
// Fetch helpers for the JSON read API (docs/api.md).

import { RANK_POINTS } from "./run_sizes.js";

// What the pages show of a run's totals: its rates from `steady`, the metrics without the run's
// first interval (warm-up: allocation, compilation, graph capture), once it has a second, so that
// half a minute of compiling does not stand for the run's speed; its amounts (steps, tokens,
// FLOPs: catalogue `amount`) over the whole run.
export function shownTotals(run, catalogue) {
  // catalogue: loadCatalogue()'s Map
  const totals = run.totals || {};
  if (!run.steady) return totals;
  const from = (name) => (catalogue.get(name)?.amount ? totals : run.steady);
  return Object.fromEntries(Object.keys(totals).map((name) => [name, from(name)[name]]));
}

const BASE = "/api/v1";

// A busy server sheds a read with 503 and Retry-After (docs/api.md): the page
// waits as told and asks again, a few times, instead of leaving a panel empty.
export const BUSY_RETRIES = 4;
const BUSY_WAIT_MAX_S = 5;

export async function fetchJSON(path) {
  for (let attempt = 0; ; attempt++) {
    const response = await fetch(BASE + path, { headers: { Accept: "application/json" } });
    if (response.status === 503 && attempt < BUSY_RETRIES) {
      const told = Number.parseFloat(response.headers.get("Retry-After") ?? "");
      const wait = Math.min(Number.isFinite(told) && told >= 0 ? told : 1, BUSY_WAIT_MAX_S);
      await new Promise((resolve) => setTimeout(resolve, wait * 1000));
      continue;
    }
    if (!response.ok) {
      // The status travels with the error: a 404 names missing runs, which pages handle.
      throw Object.assign(new Error(`GET ${BASE}${path} answered HTTP ${response.status}`), { status: response.status });
    }
    return response.json();
  }
}

// Answers asked for before the page's module ran (run_early.js, taking the head's preloads), each
// handed once to the first call for the same path.
const early = new Map();

function getJSON(path) {
  const held = early.get(path);
  if (!held) return fetchJSON(path);
  early.delete(path);
  return held;
}

// An early answer without taking it (the run page's first drawing reads the series run.js takes).
export const peekEarly = (path) => early.get(path);

// After the first load: an answer nobody took (a run without intervals has no heatmap yet) is stale.
export function forgetEarly() {
  early.clear();
}

export function fetchEarly(paths) {
  for (const path of paths) {
    const answer = fetchJSON(path);
    answer.catch(() => {}); // the page's own call sees the error, if it makes one
    early.set(path, answer);
  }
}

function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value === null || value === undefined) continue;
    for (const item of Array.isArray(value) ? value : [value]) search.append(key, item);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

const runPath = (runId) => `/runs/${encodeURIComponent(runId)}`;

export const paths = {
  catalogue: () => "/catalogue",
  run: (runId) => runPath(runId),
  series: (runId, params = {}) => runPath(runId) + "/series" + query(params),
  histogramColumns: (runId, columns) => runPath(runId) + "/histograms/over-time" + query({ columns }),
  ranks: (runId) => runPath(runId) + "/ranks" + query({ max_points: RANK_POINTS }),
};

export const getCatalogue = () => getJSON(paths.catalogue());
export const listRuns = () => getJSON("/runs");
export const getRun = (runId) => getJSON(paths.run(runId));
export const getSeries = (runId, params = {}) => getJSON(paths.series(runId, params));
export const getHistograms = (runId, interval = null) => getJSON(runPath(runId) + "/histograms" + query({ interval }));
// The Ranks panel's answer (backend/routes/ranks.py): the stragglers of each interval, and each
// rank's step time where the run has few ranks.
export const getRanks = (runId) => getJSON(paths.ranks(runId));
export const getHistogramColumns = (runId, columns) => getJSON(paths.histogramColumns(runId, columns));
export const getFacets = (archived = false) => getJSON("/facets" + query({ archived: archived ? "true" : null }));
// window "steady": over the steps of the run's rates (its first interval left out), as the tiles.
export const getSyncSites = (runId, limit = 10, window = null) => getJSON(runPath(runId) + "/sync-sites" + query({ limit, window }));
// The loss ledger of the run's steady window (docs/ledger.md).
export const getLedger = (runId) => getJSON(runPath(runId) + "/ledger");
export const compareRuns = (runIds) => getJSON("/compare" + query({ run_id: runIds }));

export const streamUrl = (runId) => BASE + runPath(runId) + "/stream";
export const runPageUrl = (runId) => `/runs/${encodeURIComponent(runId)}`;
