// csv.js: traces joined on x into CSV text, bands last, formula-looking text kept as text.
import assert from "node:assert/strict";
import { test } from "node:test";

import { tracesToCSV } from "../../frontend/static/csv.js";

test("traces join on sorted numeric x, bands after the plotted values", () => {
  const traces = [
    { name: "loss max", x: [1, 10], y: [5, 7], meta: { kind: "band", csv: "loss_max" } },
    { name: "loss", x: [2, 1], y: [20, -10], meta: { kind: "line", csv: "loss" } },
    { name: 'run "a", b', x: [10], y: ["=SUM(A1)"] },
  ];
  const expected = ['step,loss,"run ""a"", b",loss_max', "1,-10,,5", "2,20,,", "10,,'=SUM(A1),7", ""].join("\n");
  assert.equal(tracesToCSV(traces, "step"), expected);
});

test("non-numeric x keeps the order the traces give", () => {
  const traces = [{ name: "v", x: ["2024-01-02", "2024-01-01"], y: [1, null] }];
  assert.equal(tracesToCSV(traces, "time"), "time,v\n2024-01-02,1\n2024-01-01,\n");
});

test("each formula opener is neutralised, and a newline is quoted", () => {
  const openers = ["=1", "+1", "-1", "@x", "\tx", "\rx"];
  const csv = tracesToCSV([{ name: "v", x: openers.map((_, i) => i), y: openers }], "i");
  const cells = csv.trim().split("\n").slice(1).map((row) => row.slice(row.indexOf(",") + 1));
  assert.deepEqual(cells, ["'=1", "'+1", "'-1", "'@x", "'\tx", "'\rx"]);
  assert.equal(tracesToCSV([{ name: "v", x: [0], y: ["a\nb"] }], "i"), 'i,v\n0,"a\nb"\n');
});
