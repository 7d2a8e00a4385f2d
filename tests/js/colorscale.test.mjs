// colorscale.js: a value's colour on a plotly-style colour scale, and heatmap_sketch.js's cell
// geometry (where plotly puts a heatmap's bricks and which categories it labels).
import assert from "node:assert/strict";
import { test } from "node:test";

globalThis.document = { documentElement: { style: { setProperty: () => {} } } }; // colors.js sets CSS properties
const { STEP_TIME_SCALE } = await import("../../frontend/static/colors.js");
const { cellColors, parseColor, scaleColor, valueRange } = await import("../../frontend/static/colorscale.js");
const { brickEdges, categoryStep, colorRange } = await import("../../frontend/static/heatmap_sketch.js");

const GREY = [
  [0, "#000000"],
  [0.25, "rgb(100, 100, 100)"],
  [1, "#ffffff"],
];

test("colours are read from hex and rgb() stops", () => {
  assert.deepEqual(parseColor("#ff8000"), [255, 128, 0]);
  assert.deepEqual(parseColor("rgb(1, 2, 3)"), [1, 2, 3]);
  assert.throws(() => parseColor("red"), /not a colour/);
});

test("a value takes its stop's colour, or mixes the two stops around it channel by channel", () => {
  assert.equal(scaleColor(GREY, 0), "rgb(0, 0, 0)");
  assert.equal(scaleColor(GREY, 0.25), "rgb(100, 100, 100)");
  assert.equal(scaleColor(GREY, 1), "rgb(255, 255, 255)");
  // 0.125: halfway between 0 and 100; 0.625: halfway between 100 and 255, 177.5 rounded up.
  assert.equal(scaleColor(GREY, 0.125), "rgb(50, 50, 50)");
  assert.equal(scaleColor(GREY, 0.625), "rgb(178, 178, 178)");
  // Outside [0, 1]: the end colours.
  assert.equal(scaleColor(GREY, -3), "rgb(0, 0, 0)");
  assert.equal(scaleColor(GREY, 7), "rgb(255, 255, 255)");
});

test("a cell's colour spans the given range; a missing value has none", () => {
  const cellColor = cellColors(GREY, [2, 10]);
  assert.equal(cellColor(2), "rgb(0, 0, 0)");
  assert.equal(cellColor(4), "rgb(100, 100, 100)"); // (4 − 2) ÷ 8 = 0.25
  assert.equal(cellColor(10), "rgb(255, 255, 255)");
  assert.equal(cellColor(null), null);
  assert.equal(cellColor(NaN), null);
  assert.equal(cellColors(GREY, [3, 3])(3), "rgb(152, 152, 152)"); // the middle: 100 + 155 × (0.5 − 0.25) ÷ 0.75
});

test("the step-time scale runs from light (fast) to dark red (slow)", () => {
  const luma = (text) => {
    const [r, g, b] = parseColor(text);
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const lumas = STEP_TIME_SCALE.map(([, color]) => luma(color));
  assert.ok(lumas.every((v, i) => i === 0 || v < lumas[i - 1]), lumas);
  assert.deepEqual(STEP_TIME_SCALE.map(([t]) => t), [0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1]);
});

test("the colours span the finite values; all equal, half a unit each side, as plotly", () => {
  assert.deepEqual(valueRange([[3, null, 1], [NaN, 8]]), [1, 8]);
  assert.equal(valueRange([[null], []]), null);
  assert.deepEqual(colorRange([[3, null, 1], [NaN, 8]]), [1, 8]);
  assert.deepEqual(colorRange([[2, 2], [null, 2]]), [1.5, 2.5]);
  assert.deepEqual(colorRange([[null]]), [0, 1]);
});

test("bricks are centred on their x, their edges halfway between neighbours", () => {
  assert.deepEqual(brickEdges([10, 20, 40]), [5, 15, 30, 50]);
  assert.deepEqual(brickEdges([7]), [6.5, 7.5]);
});

test("a crowded category axis labels every n-th category, one a 15 px line at most", () => {
  assert.equal(categoryStep(8, 308), 1); // room for 20.5 labels: all 8
  assert.equal(categoryStep(64, 308), 4); // 64 ÷ 20.5 = 3.1
  assert.equal(categoryStep(64, 100), 10); // 64 ÷ 6.7 = 9.6
  assert.equal(categoryStep(2, 1000), 1);
});
