// colors.js: run, channel and count colours. The module sets its colours as CSS custom properties
// on import, so a stand-in document records them.
import assert from "node:assert/strict";
import { test } from "node:test";

const properties = new Map();
globalThis.document = { documentElement: { style: { setProperty: (name, value) => properties.set(name, value) } } };
const { CHANNEL_COLORS, COLORS, RUN_COLORS, channelColor, countColorOf, runColor } = await import("../../frontend/static/colors.js");

test("each colour is a CSS custom property of the page", () => {
  assert.equal(properties.get("--thd"), "#2563eb");
  assert.equal(properties.size, Object.keys(COLORS).length);
  for (const [name, value] of Object.entries(COLORS)) assert.equal(properties.get(`--${name}`), value);
});

test("runs past the list get golden-angle hues, never repeating", () => {
  assert.equal(runColor(0), RUN_COLORS[0]);
  assert.equal(runColor(11), RUN_COLORS[11]);
  // run 12: hue 12 × 137.508 mod 360 = 210.096°, saturation 0.65, lightness 0.45
  assert.equal(runColor(12), "#2873bd");
  const past = Array.from({ length: 50 }, (_, k) => runColor(12 + k));
  assert.ok(past.every((color) => /^#[0-9a-f]{6}$/.test(color)));
  assert.equal(new Set([...RUN_COLORS, ...past]).size, RUN_COLORS.length + past.length);
});

test("channel colours cycle", () => {
  assert.equal(channelColor(0), CHANNEL_COLORS[0]);
  assert.equal(channelColor(CHANNEL_COLORS.length + 1), CHANNEL_COLORS[1]);
});

test("a FLOPs count keeps its colour; other metrics have none", () => {
  assert.equal(countColorOf("tflops_thd"), "thd");
  assert.equal(countColorOf("mfu_bshd"), "baseline");
  assert.equal(countColorOf("flops_useful"), "useful");
  assert.equal(countColorOf("loss_thd"), null);
  assert.equal(countColorOf("tflops_total"), null);
});
