// @ts-check
// Length histograms (log2 buckets) as bar traces with readable bucket labels.

import { bar } from "./charts.js";
import { COLORS } from "./colors.js";

// Bucket b holds lengths in [edges[b], edges[b+1]); the last bucket is open.
export function bucketLabels(edges) {
  return edges.map((low, b) => {
    if (b === edges.length - 1) return `≥${low}`;
    const high = edges[b + 1] - 1;
    return high === low ? `${low}` : `${low}–${high}`;
  });
}

// Drops empty buckets at both ends so the bars fill the chart.
export function histogramTraces(histogram) {
  const labels = bucketLabels(histogram.edges);
  const docs = histogram.documents.tokens;
  const packs = histogram.packs.tokens;
  const used = labels.map((_, b) => (docs[b] || 0) + (packs[b] || 0) > 0);
  const first = used.indexOf(true);
  const last = used.lastIndexOf(true);
  if (first < 0) return [];
  const keep = (values) => values.slice(first, last + 1);
  return [
    bar("documents", COLORS.documents, keep(labels), keep(docs)),
    bar("packs", COLORS.packs, keep(labels), keep(packs)),
  ];
}
