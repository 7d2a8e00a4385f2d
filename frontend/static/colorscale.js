// @ts-check
// A value's colour on a colour scale given as plotly takes one ([[0, colour], …, [1, colour]]):
// the two stops around its place between lo and hi, mixed channel by channel in sRGB and rounded,
// as plotly colours a heatmap's cells. The ranks panel's still heatmap (heatmap_sketch.js) colours
// its cells with it before plotly.js has loaded.

/** @typedef {[number, string][]} ColorScale */
/** @typedef {[number, number, number]} RGB */

/** @param {string} color "#rrggbb" or "rgb(r, g, b)" */
export function parseColor(color) {
  const hex = /^#([0-9a-f]{6})$/i.exec(color);
  if (hex) {
    const value = parseInt(hex[1], 16);
    return /** @type {RGB} */ ([(value >> 16) & 255, (value >> 8) & 255, value & 255]);
  }
  const rgb = /^rgb\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)$/.exec(color);
  if (!rgb) throw new Error(`not a colour of a scale: ${color}`);
  return /** @type {RGB} */ (rgb.slice(1).map(Number));
}

/** @param {RGB} rgb */
export const rgbText = ([r, g, b]) => `rgb(${r}, ${g}, ${b})`;

// A function from t in [0, 1] (clamped) to its colour on `scale` (the stops read once).
/** @param {ColorScale} scale */
export function scaleColors(scale) {
  const stops = scale.map(([t, color]) => /** @type {[number, RGB]} */ ([t, parseColor(color)]));
  return (/** @type {number} */ t) => {
    const at = Math.min(1, Math.max(0, t));
    let k = 1;
    while (k < stops.length - 1 && stops[k][0] < at) k++;
    const [t0, a] = stops[k - 1];
    const [t1, b] = stops[k];
    const f = t1 > t0 ? (at - t0) / (t1 - t0) : 0;
    return rgbText(/** @type {RGB} */ (a.map((v, i) => Math.round(v + (b[i] - v) * f))));
  };
}

/**
 * @param {ColorScale} scale
 * @param {number} t
 */
export const scaleColor = (scale, t) => scaleColors(scale)(t);

// The smallest and largest finite value of a matrix (plotly's heatmap range without zmin/zmax);
// null where it holds none.
/** @param {(number | null)[][]} z */
export function valueRange(z) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const row of z) {
    for (const v of row) {
      if (typeof v === "number" && Number.isFinite(v)) [lo, hi] = [Math.min(lo, v), Math.max(hi, v)];
    }
  }
  return lo <= hi ? /** @type {[number, number]} */ ([lo, hi]) : null;
}

// A function from a value to its colour over [lo, hi]; null (no cell drawn) for a missing value.
// All values equal: the middle of the scale, as plotly draws them.
/**
 * @param {ColorScale} scale
 * @param {[number, number]} range
 */
export function cellColors(scale, [lo, hi]) {
  const color = scaleColors(scale);
  return (/** @type {number | null} */ value) => {
    if (typeof value !== "number" || !Number.isFinite(value)) return null;
    return color(hi > lo ? (value - lo) / (hi - lo) : 0.5);
  };
}
