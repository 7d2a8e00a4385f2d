// extension.js: a live event's new points for the traces plotly holds, against the traces a full
// drawing of the grown series gives (filled and smoothed as charts.js fills them, written out here).
import assert from "node:assert/strict";
import { test } from "node:test";

import { bandHasWidth, carriedParts, extension } from "../../frontend/static/extension.js";
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

// carriedParts: the events' own series where they continue the held one, else null (ask).
const part = (points) => ({ points });
const event = (after, last, series = part(1)) => ({ after_step: after, last_step: last, ...(series ? { series } : {}) });

test("events that continue the held series one after the other give their parts in order", () => {
  const [a, b] = [part(1), part(2)];
  assert.deepEqual(carriedParts([event(50, 60, a), event(60, 80, b)], 50), [a, b]);
});

test("an event announcing nothing past what is held is passed over", () => {
  const a = part(1);
  // the state when the stream opened (no series), then a rank's late row (no new step), then news
  const opened = { last_step: 50 };
  assert.deepEqual(carriedParts([opened, event(40, 50, null), event(50, 60, a)], 50), [a]);
  assert.deepEqual(carriedParts([opened], 50), []); // nothing to draw, nothing to ask
});

test("a gap, a missing series, an unread event or no event at all means asking", () => {
  assert.equal(carriedParts([event(40, 60)], 50), null); // it continues a step the page is past
  assert.equal(carriedParts([event(60, 70)], 50), null); // steps 51-60 never came (a reconnect)
  assert.equal(carriedParts([event(50, 60), event(70, 80)], 50), null); // the second one skips 61-70
  assert.equal(carriedParts([{ last_step: 60 }], 50), null); // more intervals than an event carries
  assert.equal(carriedParts([null], 50), null); // not JSON
  assert.equal(carriedParts([], 50), null); // the status poll, not an event
});

// bandHasWidth: a band edge's column has a width where its max exceeds its min (nulls skipped).
test("a band has a width only where a point's max exceeds its min, from the index asked on", () => {
  const columns = { a_max: [2, null, 3, 4], a_min: [2, 1, 3, 1] };
  assert.equal(bandHasWidth(columns, "a_max"), true);
  assert.equal(bandHasWidth(columns, "a_min"), true); // either edge names the band
  assert.equal(bandHasWidth(columns, "a_max", 3), true);
  assert.equal(bandHasWidth({ a_max: [2, null, 3], a_min: [2, 1, 3] }, "a_max"), false);
  assert.equal(bandHasWidth({ a_max: [2, 5], a_min: [2, 1] }, "a_max", 2), false); // none from index 2 on
});

test("a band left undrawn for having no width asks for a full drawing once new points give it one", () => {
  const columns = { step: [10, 20, 30], a: [1, 2, 3], a_max: [1, 2, 4], a_min: [1, 2, 2] };
  const hiddenEdges = (n) =>
    ["a_max", "a_min"].map((column) => ({ meta: { column, kind: "band" }, visible: false, x: columns.step.slice(0, n) }));
  assert.equal(extension(hiddenEdges(2), columns, 2, "step", 0), null); // the third point has a width
  const flat = { ...columns, a_max: [1, 2, 3], a_min: [1, 2, 3] };
  assert.deepEqual(extension(hiddenEdges(2), flat, 2, "step", 0).indices, [0, 1]); // still none: extended
});
