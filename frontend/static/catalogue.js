// @ts-check
// The server's catalogue (GET /api/v1/catalogue): every metric's label, unit, d3 format and
// definition. Fetched once per page; nothing on a page names or formats a metric by itself.

import { getCatalogue } from "./api.js";

let loading = null;

// Resolves to a Map from metric name to { name, label, unit, format, doc, band, amount }.
export function loadCatalogue() {
  loading ??= getCatalogue().then(({ metrics }) => new Map(metrics.map((m) => [m.name, m])));
  return loading;
}

// The metric, or an error naming it: a typo in a page's metric list should fail loudly.
export function metricOf(catalogue, name) {
  const metric = catalogue.get(name);
  if (!metric) throw new Error(`the catalogue has no metric "${name}"`);
  return metric;
}
