// extension.js: a live event's new points for the traces plotly holds, against the traces a full
// drawing of the grown series gives (filled and smoothed as charts.js fills them, written out here).
import assert from "node:assert/strict";
import { test } from "node:test";

import { extension } from "../../frontend/static/extension.js";
import { ema } from "../../frontend/static/smoothing.js";

const grown = { step: [10, 20, 30, 40, 50], a: [1, 2, null, 4, 5], a_max: [2, 3, null, 5, 6] };

// The traces a chart holds after drawing the first `n` points: a band edge, a faded line and its
// smoothed copy (smoothing on).
function drawnAfter(columns, n, weight) {
  const cut = (name) => columns[name].slice(0, n);
  return [
    { meta: { column: "a_max", kind: "band" }, x: cut("step"), y: cut("a_max") },
    { meta: { column: "a", kind: "line" }, x: cut("step"), y: cut("a") },
    { meta: { column: "a", kind: "smoothed" }, x: cut("step"), y: ema(cut("a"), weight) },
  ];
}

test("held traces plus the extension are the traces of a full drawing", () => {
  const weight = 0.6;
  const drawn = drawnAfter(grown, 2, weight);
  const { update, indices } = extension(drawn, grown, 2, "step", weight);
  assert.deepEqual(indices, [0, 1, 2]);
  const full = drawnAfter(grown, 5, weight);
  drawn.forEach((trace, i) => {
    assert.deepEqual([...trace.x, ...update.x[i]], full[i].x);
    assert.deepEqual([...trace.y, ...update.y[i]], full[i].y);
  });
  // The smoothed tail continues the EMA over the whole column, not one restarted at the new points.
  assert.notDeepEqual(update.y[2], ema(grown.a.slice(2), weight));
});

test("nothing new extends by nothing", () => {
  const { update } = extension(drawnAfter(grown, 5, 0), grown, 5, "step", 0);
  assert.deepEqual(update.x, [[], [], []]);
});

test("a trace that does not end where the chart was drawn, or a column not held, asks for a full drawing", () => {
  const drawn = drawnAfter(grown, 2, 0);
  assert.equal(extension(drawn, grown, 3, "step", 0), null);
  assert.equal(extension(drawn, grown, 9, "step", 0), null);
  assert.equal(extension(drawn, { step: grown.step, a: grown.a }, 2, "step", 0), null);
  assert.equal(extension(drawn, grown, 2, "tokens_seen", 0), null);
});
