// smoothing.js: the debiased exponential moving average, worked by hand.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ema } from "../../frontend/static/smoothing.js";

const close = (actual, expected) =>
  actual.forEach((value, i) =>
    expected[i] === null ? assert.equal(value, null) : assert.ok(Math.abs(value - expected[i]) < 1e-12, `${i}: ${value} vs ${expected[i]}`),
  );

test("each point is the debiased average of the points so far", () => {
  // weight 0.5: 0.5·1 / (1 − 0.5) = 1, then (0.25 + 1.5) / (1 − 0.25) = 7/3
  close(ema([1, 3], 0.5), [1, 7 / 3]);
});

test("debiasing keeps a constant series constant from its first point", () => {
  close(ema([2, 2, 2, 2], 0.9), [2, 2, 2, 2]);
});

test("a gap stays a gap and does not count as a point", () => {
  close(ema([1, null, 3], 0.5), [1, null, 7 / 3]);
  close(ema([1, NaN, 3], 0.5), [1, null, 7 / 3]);
});

test("weight 0 draws the values themselves", () => {
  close(ema([4, 5, -1], 0), [4, 5, -1]);
});
