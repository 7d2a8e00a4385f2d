// Number formatting: 3 significant digits with units, "—" for missing values.

const DASH = "—";
const SI = [
  [1e12, "T"],
  [1e9, "G"],
  [1e6, "M"],
  [1e3, "k"],
];

const missing = (x) => x === null || x === undefined || Number.isNaN(x);

// 3 significant digits in plain notation: 0.660, 12.3, 1,260 (toPrecision alone gives 1.26e+3).
export function num(x) {
  if (missing(x)) return DASH;
  if (x === 0) return "0";
  const abs = Math.abs(x);
  if (abs < 1e-3) return x.toExponential(2);
  if (abs >= 1000) return Number(x.toPrecision(3)).toLocaleString("en-US");
  return x.toPrecision(3);
}

// SI prefixes for quantities that span many decades (tokens/s): 81.9k, 1.23M.
export function si(x) {
  if (missing(x)) return DASH;
  const abs = Math.abs(x);
  for (const [scale, prefix] of SI) {
    if (abs >= scale) return `${Number((x / scale).toPrecision(3))}${prefix}`;
  }
  return num(x);
}

export const pct = (x) => (missing(x) ? DASH : `${num(x)} %`);
export const fraction = (x) => (missing(x) ? DASH : pct(100 * x));
export const int = (x) => (missing(x) ? DASH : Math.round(x).toLocaleString("en-US"));

// A difference to one decimal; float noise like 1e-14 reads as "same".
export function signed(x, unit) {
  const rounded = Math.round(x * 10) / 10;
  if (rounded === 0) return "same";
  return `${rounded > 0 ? "+" : "−"}${Math.abs(rounded).toFixed(1)} ${unit}`;
}

// Step times span µs to minutes; pick the unit that keeps the digits meaningful.
export function seconds(x) {
  if (missing(x)) return DASH;
  if (Math.abs(x) < 1e-3) return `${num(x * 1e6)} µs`;
  if (Math.abs(x) < 1) return `${num(x * 1e3)} ms`;
  return `${num(x)} s`;
}
