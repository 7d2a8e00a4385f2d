// Numbers as the catalogue's d3-format specifiers say, so a column reads the same in a table,
// a card and a plotly hover (plotly formats with d3-format itself). Only the specifiers the
// catalogue uses are implemented: ".Ng", ".Ns", ".Nf", ".N%", ",d"; anything else throws, so a
// new specifier in the catalogue is noticed here rather than shown wrongly.

const DASH = "—";
const MINUS = "−"; // d3's minus sign
const PREFIXES = ["y", "z", "a", "f", "p", "n", "µ", "m", "", "k", "M", "G", "T", "P", "E", "Z", "Y"];

const missing = (x) => x === null || x === undefined || !Number.isFinite(x);

// SI prefix chosen from the exponent after rounding, as d3 does: 999.96 → "1.000k".
function si(abs, precision) {
  if (abs === 0) return (0).toPrecision(precision);
  const exponent = Number(abs.toExponential(precision - 1).split("e")[1]);
  const k = Math.max(-8, Math.min(8, Math.floor(exponent / 3)));
  return (abs / 10 ** (3 * k)).toPrecision(precision) + PREFIXES[k + 8];
}

const TYPES = {
  g: (abs, p) => abs.toPrecision(p),
  s: si,
  f: (abs, p) => abs.toFixed(p),
  "%": (abs, p) => `${(abs * 100).toFixed(p)}%`,
  d: (abs) => String(Math.round(abs)),
};

function group(text) {
  const [whole, rest = ""] = text.split(/(?=\.)/);
  return whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",") + rest;
}

// formatNumber(".4g", 0.05) === "0.05000"; "—" for a missing value.
export function formatNumber(spec, x) {
  if (missing(x)) return DASH;
  const match = /^(,)?(?:\.(\d+))?([gsf%d])$/.exec(spec);
  if (!match) throw new Error(`format.js does not implement the d3 specifier "${spec}"`);
  const [, comma, precision, type] = match;
  let text = TYPES[type](Math.abs(x), precision === undefined ? 6 : Number(precision));
  if (comma) text = group(text);
  const negative = x < 0 && Number(text.replace(/[^\d.]/g, "")) !== 0;
  return negative ? MINUS + text : text;
}

// A unit that the label already names (a "… TFLOP/s/GPU" or "… tokens/s" label) is not repeated.
export const unitInLabel = (metric) =>
  new RegExp(`(^|\\s)${metric.unit.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")}($|\\s|/)`).test(metric.label);

// Unit symbols an SI prefix joins ("7.85 mJ"); words keep the prefix on the number ("81.92k tokens").
const SYMBOLS = new Set(["J", "W", "s", "B", "FLOP"]);

// A catalogue metric's value with its unit: "0.05000 s", "7.85 mJ", "45.3%".
export function display(metric, x) {
  const text = formatNumber(metric.format, x);
  if (text === DASH || !metric.unit || unitInLabel(metric)) return text;
  const prefixed = /^(.*\d)([^\d])$/.exec(text);
  if (metric.format.endsWith("s") && SYMBOLS.has(metric.unit) && prefixed) return `${prefixed[1]} ${prefixed[2]}${metric.unit}`;
  // "%" sits on the number, as d3's "%" type puts it: "0.6%" next to an MFU of "1.5%".
  return metric.unit === "%" ? `${text}%` : `${text} ${metric.unit}`;
}

// The unit after a number that plotly formats (hovers, ticks), spaced as display() spaces it.
export function unitSuffix(metric) {
  if (!metric.unit || unitInLabel(metric)) return "";
  return metric.unit === "%" ? "%" : ` ${metric.unit}`;
}

// A difference to one decimal; float noise like 1e-14 reads as "same".
export function signed(x, unit) {
  const rounded = Math.round(x * 10) / 10;
  if (rounded === 0) return "same";
  return `${rounded > 0 ? "+" : MINUS}${Math.abs(rounded).toFixed(1)} ${unit}`;
}

export const count = (x) => formatNumber(",d", x);
