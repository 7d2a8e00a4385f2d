// linkedzoom.js: an x zoom on one linked chart is sent to the others, once. Plotly is stood in
// for by a recorder that, like plotly, fires plotly_relayout on the chart it relayouts.
import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import { linkX, unlinkX } from "../../frontend/static/linkedzoom.js";

const calls = [];
globalThis.Plotly = {
  relayout: async (plot, update) => {
    calls.push([plot.id, update]);
    await plot.fire(update);
  },
};

const plots = [];
function chart(id, drawn = true) {
  const handlers = [];
  const plot = {
    id,
    data: drawn ? [] : undefined,
    handlers,
    on: (event, handler) => event === "plotly_relayout" && handlers.push(handler),
    fire: (event) => Promise.all(handlers.map((handler) => handler(event))),
  };
  plots.push(plot);
  return plot;
}

afterEach(() => {
  plots.splice(0).forEach(unlinkX);
  calls.length = 0;
});

test("a zoomed range reaches every other drawn chart, without echoes", async () => {
  const [a, b, c] = [chart("a"), chart("b"), chart("c")];
  [a, b, c].forEach(linkX);
  await a.fire({ "xaxis.range[0]": 5, "xaxis.range[1]": 9 });
  assert.deepEqual(calls, [
    ["b", { "xaxis.range": [5, 9] }],
    ["c", { "xaxis.range": [5, 9] }],
  ]);
});

test("the range as an array and autorange are shared too; a y zoom is not", async () => {
  const [a, b] = [chart("a"), chart("b")];
  [a, b].forEach(linkX);
  await a.fire({ "xaxis.range": [1, 2] });
  await a.fire({ "xaxis.autorange": true });
  await a.fire({ "yaxis.range[0]": 0, "yaxis.range[1]": 1 });
  assert.deepEqual(calls, [
    ["b", { "xaxis.range": [1, 2] }],
    ["b", { "xaxis.autorange": true }],
  ]);
});

test("an undrawn or unlinked chart is left alone, and linking twice listens once", async () => {
  const [a, b, c] = [chart("a"), chart("b", false), chart("c")];
  [a, b, c, a].forEach(linkX);
  assert.equal(a.handlers.length, 1);
  unlinkX(c);
  await a.fire({ "xaxis.autorange": true });
  assert.deepEqual(calls, []);
});
