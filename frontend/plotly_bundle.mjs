// Builds the plotly.js bundle the server serves (frontend/vendor/plotly.min.js): plotly.js's
// core with only the trace types the pages draw, from the `plotly.js` package that
// package-lock.json pins, by the esbuild it pins, with plotly.js's own build settings
// (its esbuild-config.js). `make vendor-plotly` runs it after `npm ci`; the bundle is committed,
// so that the server needs no npm, and tests/test_vendored_plotly.py rebuilds it and holds the
// two byte-equal.
//
// Why not a published partial bundle: the smallest that holds heatmaps (cartesian) also carries
// box, violin, histogram2d, contour, pie, image and the world calendars; its top-level code,
// run before a chart can be drawn, took about twice this bundle's time in Chromium (2-core VM,
// docs/benchmarks/2026-12-07-2core-bundle.md).
//
//   node frontend/plotly_bundle.mjs [OUT]     (OUT: default frontend/vendor/plotly.min.js)
import { build } from "esbuild";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
// Every trace type a page draws (the histograms are bars); a chart of another type would be
// refused by plotly ("trace type not found"), which the browser tests would see as a page error.
const TRACES = ["scatter", "bar", "heatmap"];

const version = JSON.parse(readFileSync(join(ROOT, "node_modules/plotly.js/package.json"), "utf8")).version;
const entry = [
  'var Plotly = require("plotly.js/lib/core");',
  `Plotly.register([${TRACES.map((t) => `require("plotly.js/lib/${t}")`).join(", ")}]);`,
  "module.exports = Plotly;",
].join("\n");

const out = process.argv[2] ?? join(ROOT, "frontend/vendor/plotly.min.js");
await build({
  stdin: { contents: entry, resolveDir: ROOT, sourcefile: "plotly-entry.js" },
  bundle: true,
  minify: true,
  format: "iife",
  globalName: "Plotly",
  // As plotly.js's esbuild-config.js: browser globals for Node's, one regl, no AMD.
  define: { global: "window", "define.amd": "false" },
  alias: { regl: "@plotly/regl", stream: "stream-browserify" },
  target: "es2016",
  // The one stylesheet plotly.js asks for is maplibre's, for map traces, which this bundle
  // leaves out: read as empty instead of written beside the bundle.
  loader: { ".css": "empty" },
  banner: {
    js: `/**\n* plotly.js (${TRACES.join(", ")} - minified) v${version}\n* Copyright 2012-2026, Plotly, Inc.\n* All rights reserved.\n* Licensed under the MIT license\n*/`,
  },
  legalComments: "eof",
  outfile: out,
  logLevel: "warning",
});
