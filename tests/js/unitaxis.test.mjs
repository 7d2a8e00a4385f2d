// unitaxis.js: y ticks for a unit that takes the SI prefix, labelled by format.js's display().
import assert from "node:assert/strict";
import { test } from "node:test";

import { unitTicks, yExtent } from "../../frontend/static/unitaxis.js";

const memory = { name: "mem", label: "memory", unit: "B", format: ".3s" };

test("a linear axis steps by 1, 2 or 5 times a power of ten", () => {
  assert.deepEqual(unitTicks(memory, 0, 50e9), {
    tickmode: "array",
    tickvals: [0, 1e10, 2e10, 3e10, 4e10, 5e10],
    ticktext: ["0 B", "10 GB", "20 GB", "30 GB", "40 GB", "50 GB"],
  });
  // 0.7 GB wide: a fifth is 0.14 GB, so 0.2 GB steps
  assert.deepEqual(unitTicks(memory, 0.1e9, 0.8e9).tickvals, [0.2e9, 0.4e9, 0.6e9, 0.8e9]);
});

test("a log axis over few decades adds their 2x and 5x", () => {
  assert.deepEqual(unitTicks(memory, 1e3, 1e5, true), {
    tickmode: "array",
    tickvals: [1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5],
    ticktext: ["1 kB", "2 kB", "5 kB", "10 kB", "20 kB", "50 kB", "100 kB"],
  });
  assert.deepEqual(unitTicks(memory, 1, 1e6, true).tickvals, [1, 10, 100, 1e3, 1e4, 1e5, 1e6]);
});

test("no range leaves the ticks to plotly", () => {
  assert.deepEqual(unitTicks(memory, NaN, 1), { tickmode: "auto" });
  assert.deepEqual(unitTicks(memory, -1, 0, true), { tickmode: "auto" });
});

test("yExtent spans the finite numbers, from zero when asked", () => {
  assert.deepEqual(yExtent([{ y: [3, null, -1] }, { y: [7, "x", NaN] }, {}], false), [-1, 7]);
  assert.deepEqual(yExtent([{ y: [3, 5] }], true), [0, 5]);
  assert.deepEqual(yExtent([], false), [Infinity, -Infinity]);
});
