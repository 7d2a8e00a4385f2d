// chart_legend.js: which traces a legend names, which it hides with an entry, and what a click
// or a double click leaves hidden.
import assert from "node:assert/strict";
import { test } from "node:test";

import { afterClick, entryKey, hideTraces, legendEntries } from "../../frontend/static/chart_legend.js";

const lineOf = (column, name, rank, extra = {}) => ({ type: "scatter", name, legendrank: rank, line: { color: "#111", dash: "dash", width: 2.5 }, meta: { column, kind: "line" }, ...extra });
const edge = (column, suffix, visible = true) => ({ type: "scatter", name: `x ${suffix}`, showlegend: false, visible, meta: { column: `${column}_${suffix}`, kind: "band" } });

test("one entry a named line, in legendrank order, its band and faded copy left out", () => {
  const traces = [
    edge("a", "max"),
    edge("a", "min"),
    lineOf("a", "per-document", 2),
    lineOf("b", "useful", 1),
    { ...lineOf("b", "useful", 1), opacity: 0.3, showlegend: false },
    { ...lineOf("b", "useful", 1), meta: { column: "b", kind: "smoothed" } },
  ];
  const entries = legendEntries(traces, { showlegend: true });
  assert.deepEqual(
    entries.map((e) => [e.key, e.name]),
    [["b", "useful"], ["a", "per-document"]],
  );
  assert.deepEqual(entries[1], { key: "a", name: "per-document", color: "#111", dash: "dash", width: 2.5, bar: false });
});

test("no entries where the layout turns the legend off or nothing is named", () => {
  assert.deepEqual(legendEntries([lineOf("a", "a", 1)], { showlegend: false }), []);
  assert.deepEqual(legendEntries([{ type: "heatmap", meta: { kind: "heatmap" } }], { showlegend: true }), []);
});

test("a bar trace is an entry of its own name, with its marker's colour", () => {
  const bar = { type: "bar", name: "documents", marker: { color: "#222" }, meta: { kind: "bar", csv: "documents" } };
  const [entry] = legendEntries([bar], {});
  assert.deepEqual([entry.key, entry.color, entry.bar], ["documents", "#222", true]);
});

test("hiding an entry hides its line, band edges and copies; a band without a width stays as it is", () => {
  const traces = [edge("a", "max"), edge("a", "min", false), lineOf("a", "a", 1), lineOf("b", "b", 2)];
  assert.deepEqual(traces.map(entryKey), ["a", "a", "a", "b"]);
  const hidden = hideTraces(traces, new Set(["a"]));
  assert.deepEqual(
    hidden.map((t) => t.visible),
    ["legendonly", false, "legendonly", undefined],
  );
  assert.equal(hideTraces(traces, new Set()), traces);
  assert.equal(traces[0].visible, true); // the traces given are not changed
});

test("a click toggles one entry; a double click shows it alone, and all again once it is alone", () => {
  const entries = ["a", "b", "c"].map((key) => ({ key }));
  assert.deepEqual([...afterClick(entries, new Set(), "b", false)], ["b"]);
  assert.deepEqual([...afterClick(entries, new Set(["b"]), "b", false)], []);
  assert.deepEqual([...afterClick(entries, new Set(["a"]), "b", true)].sort(), ["a", "c"]);
  assert.deepEqual([...afterClick(entries, new Set(["a", "c"]), "b", true)], []);
  assert.deepEqual([...afterClick(entries, new Set(["b", "c"]), "b", true)].sort(), ["a", "c"]); // b was hidden: now alone
});
