// Fetch helpers for the JSON read API (docs/api.md).

const BASE = "/api/v1";

async function getJSON(path) {
  const response = await fetch(BASE + path, { headers: { Accept: "application/json" } });
  if (!response.ok) {
    // The status travels with the error: a 404 names missing runs, which pages handle.
    const error = new Error(`GET ${BASE}${path} answered HTTP ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return response.json();
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

export const getCatalogue = () => getJSON("/catalogue");
export const listRuns = () => getJSON("/runs");
export const getRun = (runId) => getJSON(runPath(runId));
export const getSeries = (runId, params = {}) => getJSON(runPath(runId) + "/series" + query(params));
export const getHistograms = (runId, interval = null) => getJSON(runPath(runId) + "/histograms" + query({ interval }));
export const getHistogramColumns = (runId, columns) => getJSON(runPath(runId) + "/histograms/over-time" + query({ columns }));
export const getFacets = (archived = false) => getJSON("/facets" + query({ archived: archived ? "true" : null }));
export const getSyncSites = (runId, limit = 10) => getJSON(runPath(runId) + "/sync-sites" + query({ limit }));
export const compareRuns = (runIds) => getJSON("/compare" + query({ run_id: runIds }));

export const streamUrl = (runId) => BASE + runPath(runId) + "/stream";
export const runPageUrl = (runId) => `/runs/${encodeURIComponent(runId)}`;
