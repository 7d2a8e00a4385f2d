// sketch.js's ticks: 1, 2 or 5 × 10^k over a range, and none where doubles cannot step through it.
import assert from "node:assert/strict";
import { test } from "node:test";

import { niceTicks } from "../../frontend/static/sketch.js";

test("ticks fall on 1, 2 or 5 times a power of ten inside the range", () => {
  assert.deepEqual(niceTicks(0, 10, 5), [0, 2, 4, 6, 8, 10]);
  assert.deepEqual(niceTicks(0.95, 1.32, 4), [1, 1.1, 1.2, 1.3]);
  assert.deepEqual(niceTicks(-7, 7, 3), [-5, 0, 5]);
});

test("a range of equal values but for their last bits gets no ticks, and ends", () => {
  // A straggler spread of 1.1 in every interval, rounded apart in its last bit.
  assert.deepEqual(niceTicks(1.0999999999999999, 1.1000000000000003, 5), []);
  assert.deepEqual(niceTicks(NaN, NaN, 5), []);
});
