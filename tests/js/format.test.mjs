// format.js: d3-style number formatting, each expectation worked out by hand from the specifier.
import assert from "node:assert/strict";
import { test } from "node:test";

import { count, display, formatNumber, prefixJoinsUnit, signed, unitSuffix } from "../../frontend/static/format.js";

const metric = (unit, format, label = "value") => ({ name: "m", label, unit, format });

test("formatNumber follows each implemented d3 specifier", () => {
  assert.equal(formatNumber(".4g", 0.05), "0.05000");
  assert.equal(formatNumber(".2f", 3.14159), "3.14");
  assert.equal(formatNumber(".1%", 0.453), "45.3%");
  assert.equal(formatNumber(",d", 1234567.4), "1,234,567");
  assert.equal(formatNumber(".3s", 0.00785), "7.85m");
  assert.equal(formatNumber(".3s", 50e9), "50.0G");
});

test("the SI prefix is chosen after rounding, as d3 does", () => {
  assert.equal(formatNumber(".4s", 999.96), "1.000k");
  assert.equal(formatNumber(".4s", 999.94), "999.9");
});

test("~ trims insignificant trailing zeros", () => {
  assert.equal(formatNumber(".3~s", 50e9), "50G");
  assert.equal(formatNumber(".4~f", 2.5), "2.5");
  assert.equal(formatNumber(".1~f", 100), "100");
});

test("negatives take d3's minus sign, but not a value that rounds to zero", () => {
  assert.equal(formatNumber(".2f", -1.5), "−1.50");
  assert.equal(formatNumber(".2f", -0.001), "0.00");
});

test("a missing value is a dash and an unknown specifier throws", () => {
  for (const x of [null, undefined, NaN, Infinity]) assert.equal(formatNumber(".2f", x), "—");
  assert.throws(() => formatNumber(".2e", 1), /does not implement the d3 specifier "\.2e"/);
});

test("display joins an SI prefix to a unit symbol and spaces other units", () => {
  assert.equal(display(metric("s", ".4g", "step time"), 0.05), "0.05000 s");
  assert.equal(display(metric("J", ".3s", "energy"), 0.00785), "7.85 mJ");
  assert.equal(display(metric("B", ".3s", "memory"), 50e9), "50.0 GB");
  assert.equal(display(metric("B", ".3s", "memory"), 500), "500 B");
  assert.equal(display(metric("tokens", ".4s", "seen"), 81920), "81.92k tokens");
  assert.equal(display(metric("%", ".1f", "MFU"), 45.3), "45.3%");
  assert.equal(display(metric("s", ".4g", "step time"), null), "—");
});

test("display rescales a value under 1 of a prefixed unit and leaves a unit the label names", () => {
  assert.equal(display(metric("TFLOP/s", ".4g", "throughput"), 6.516e-5), "65.16 MFLOP/s");
  assert.equal(display(metric("TFLOP/s", ".4g", "useful TFLOP/s/GPU"), 123.456), "123.5");
});

test("prefixJoinsUnit and unitSuffix", () => {
  assert.equal(prefixJoinsUnit(metric("J", ".3s")), true);
  assert.equal(prefixJoinsUnit(metric("tokens", ".3s")), false);
  assert.equal(prefixJoinsUnit(metric("J", ".3g")), false);
  assert.equal(unitSuffix(metric("%", ".1f")), "%");
  assert.equal(unitSuffix(metric("s", ".4g", "step time")), " s");
  assert.equal(unitSuffix(metric("tokens/s", ".4g", "throughput tokens/s")), "");
  assert.equal(unitSuffix(metric("", ".4g")), "");
});

test("signed rounds to one decimal and calls float noise the same", () => {
  assert.equal(signed(1.04, "pp"), "+1.0 pp");
  assert.equal(signed(-2.36, "%"), "−2.4 %");
  assert.equal(signed(1e-14, "s"), "same");
  assert.equal(signed(-0.04, "s"), "same");
});

test("count groups thousands", () => {
  assert.equal(count(1234567), "1,234,567");
  assert.equal(count(999), "999");
  assert.equal(count(null), "—");
});
