// @ts-check
// Numbers as the catalogue's d3-format specifiers say, so a column reads the same in a table,
// a card and a plotly hover (plotly formats with d3-format itself). Only the specifiers the
// catalogue uses are implemented: ".Ng", ".Ns", ".Nf", ".N%", ",d", each with d3's "~" (trailing
// zeros trimmed, as axis ticks show them); anything else throws, so a
// new specifier in the catalogue is noticed here rather than shown wrongly.

const DASH = "—";
const MINUS = "−"; // d3's minus sign
const PREFIXES = ["y", "z", "a", "f", "p", "n", "µ", "m", "", "k", "M", "G", "T", "P", "E", "Z", "Y"];

// Typed as a guard so that a value past it is a number to the checker; NaN and ±Infinity are
// missing too, though typed number.
/**
 * @param {number | null | undefined} x
 * @returns {x is null | undefined}
 */
const missing = (x) => x === null || x === undefined || !Number.isFinite(x);

// SI prefix chosen from the exponent after rounding, as d3 does: 999.96 → "1.000k".
/**
 * @param {number} abs
 * @param {number} precision
 */
function si(abs, precision) {
  if (abs === 0) return (0).toPrecision(precision);
  const exponent = Number(abs.toExponential(precision - 1).split("e")[1]);
  const k = Math.max(-8, Math.min(8, Math.floor(exponent / 3)));
  return (abs / 10 ** (3 * k)).toPrecision(precision) + PREFIXES[k + 8];
}

/** @type {Record<string, (abs: number, precision: number) => string>} */
const TYPES = {
  g: (abs, p) => abs.toPrecision(p),
  s: si,
  f: (abs, p) => abs.toFixed(p),
  "%": (abs, p) => `${(abs * 100).toFixed(p)}%`,
  d: (abs) => String(Math.round(abs)),
};

/** @param {string} text */
function group(text) {
  const [whole, rest = ""] = text.split(/(?=\.)/);
  return whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",") + rest;
}

// d3's "~": insignificant trailing zeros go ("50.00G" → "50G", "2.500" → "2.5").
const trimmed = (/** @type {string} */ text) => text.replace(/\.(\d*?)0+(?=\D*$)/, (_, /** @type {string} */ kept) => (kept ? `.${kept}` : ""));

// formatNumber(".4g", 0.05) === "0.05000"; "—" for a missing value.
/**
 * @param {string} spec
 * @param {number | null | undefined} x
 */
export function formatNumber(spec, x) {
  if (missing(x)) return DASH;
  const match = /^(,)?(?:\.(\d+))?(~)?([gsf%d])$/.exec(spec);
  if (!match) throw new Error(`format.js does not implement the d3 specifier "${spec}"`);
  const [, comma, precision, trim, type] = match;
  let text = TYPES[type](Math.abs(x), precision === undefined ? 6 : Number(precision));
  if (trim) text = trimmed(text);
  if (comma) text = group(text);
  const negative = x < 0 && Number(text.replace(/[^\d.]/g, "")) !== 0;
  return negative ? MINUS + text : text;
}

// A unit that the label already names (a "… TFLOP/s/GPU" or "… tokens/s" label) is not repeated.
export const unitInLabel = (/** @type {Metric} */ metric) =>
  new RegExp(`(^|\\s)${metric.unit.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")}($|\\s|/)`).test(metric.label);

// Unit symbols an SI prefix joins ("7.85 mJ"); words keep the prefix on the number ("81.92k tokens").
const SYMBOLS = new Set(["J", "W", "s", "B", "FLOP"]);

// Whether an SI prefix of the number joins the unit ("7.85 mJ", "50 GB"): a format with "s"
// (SI) and a unit symbol.
export const prefixJoinsUnit = (/** @type {Metric} */ metric) => /s$/.test(metric.format) && SYMBOLS.has(metric.unit);

// A unit that carries an SI prefix itself ("TFLOP/s") and a value under 1 of it: shown with the
// prefix that gives the number whole digits, 6.516e-5 TFLOP/s as "65.16 MFLOP/s" (a CPU run),
// where "0.00006516" would have to be counted.
/**
 * @param {Metric} metric
 * @param {number | null | undefined} x
 */
function rescaled(metric, x) {
  const unit = /^([kMGTPE])(\D.*)$/.exec(metric.unit || "");
  if (!unit || missing(x) || x === 0 || Math.abs(x) >= 1 || !/g$/.test(metric.format)) return null;
  const base = x * 10 ** (3 * (PREFIXES.indexOf(unit[1]) - 8));
  const text = formatNumber(metric.format.replace(/g$/, "s"), base);
  return `${text.slice(0, -1)} ${text.slice(-1)}${unit[2]}`;
}

// A catalogue metric's value with its unit: "0.05000 s", "7.85 mJ", "45.3%", "65.16 MFLOP/s".
/**
 * @param {Metric} metric
 * @param {number | null | undefined} x
 */
export function display(metric, x) {
  const smaller = rescaled(metric, x);
  if (smaller) return smaller;
  const text = formatNumber(metric.format, x);
  if (text === DASH || !metric.unit || unitInLabel(metric)) return text;
  const prefixed = /^(.*\d)([^\d])$/.exec(text);
  if (prefixJoinsUnit(metric) && prefixed) return `${prefixed[1]} ${prefixed[2]}${metric.unit}`;
  // "%" sits on the number, as d3's "%" type puts it: "0.6%" next to an MFU of "1.5%".
  return metric.unit === "%" ? `${text}%` : `${text} ${metric.unit}`;
}

// The unit after a number that plotly formats (hovers, ticks), spaced as display() spaces it.
/** @param {Metric} metric */
export function unitSuffix(metric) {
  if (!metric.unit || unitInLabel(metric)) return "";
  return metric.unit === "%" ? "%" : ` ${metric.unit}`;
}

// A difference to one decimal; float noise like 1e-14 reads as "same".
/**
 * @param {number} x
 * @param {string} unit
 */
export function signed(x, unit) {
  const rounded = Math.round(x * 10) / 10;
  if (rounded === 0) return "same";
  return `${rounded > 0 ? "+" : MINUS}${Math.abs(rounded).toFixed(1)} ${unit}`;
}

export const count = (/** @type {number | null | undefined} */ x) => formatNumber(",d", x);
