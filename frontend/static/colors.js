// @ts-check
// The one place colours are defined. Charts take them from here; the stylesheet reads the same
// values as CSS custom properties (--thd, --baseline, ...), set on <html> when a page imports this.

export const COLORS = {
  baseline: "#d97706", // amber: the dense count (the work of a padded run, more than a packed one ran)
  thd: "#2563eb", // blue: the per-document (THD-corrected) count
  useful: "#059669", // green: real tokens only, the headline across layouts
  overcount: "#dc2626",
  neutral: "#475569",
  documents: "#7c3aed",
  packs: "#0891b2",
  system: "#9333ea",
  remainder: "#9ca3af", // grey: what the kernels leave of the step (the ledger's "the rest")
  unattributed: "#d1d5db", // light grey: the step that terms not measured leave unexplained
};

// Distinct colours for runs on the compare page, kept apart from the metric colours above: a dozen
// compared runs (the page's usual crowd) each get one of these.
export const RUN_COLORS = [
  "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#334155", "#ea580c",
  "#4f46e5", "#0f766e", "#a16207", "#be123c", "#0369a1", "#86198f",
];

// An sRGB hex colour of a hue (degrees) at fixed saturation and lightness.
/** @param {number} hue */
function hueHex(hue, saturation = 0.65, lightness = 0.4) {
  const a = saturation * Math.min(lightness, 1 - lightness);
  const channel = (/** @type {number} */ n) => {
    const k = (n + hue / 30) % 12;
    const value = lightness - a * Math.max(-1, Math.min(k - 3, 9 - k, 1));
    return Math.round(255 * value).toString(16).padStart(2, "0");
  };
  return `#${channel(0)}${channel(8)}${channel(4)}`;
}

// Past the list, hues a golden angle apart (never repeating), in hex as the bands' fills need.
export const runColor = (/** @type {number} */ i) => RUN_COLORS[i] ?? hueHex((i * 137.508) % 360, 0.65, i % 2 ? 0.35 : 0.45);

// Data channels (code, math, web, ...) on the per-channel loss chart, in the channels' sorted order.
export const CHANNEL_COLORS = ["#0f766e", "#b45309", "#7c3aed", "#be123c", "#1d4ed8", "#4d7c0f", "#a21caf", "#0e7490"];

export const channelColor = (/** @type {number} */ i) => CHANNEL_COLORS[i % CHANNEL_COLORS.length];

// Shares (0..1) on heatmaps: light for none, dark for all.
export const SHARE_SCALE = [
  [0, "#f8fafc"],
  [0.5, "#60a5fa"],
  [1, "#1e3a8a"],
];

// Step times on the ranks heatmap: ColorBrewer's YlOrRd, light for the fastest ranks, dark red for
// the slowest. Plotly's chart and the still drawn before it (heatmap_sketch.js) both take it from here.
/** @type {[number, string][]} */
export const STEP_TIME_SCALE = [
  [0, "rgb(255, 255, 204)"],
  [0.125, "rgb(255, 237, 160)"],
  [0.25, "rgb(254, 217, 118)"],
  [0.375, "rgb(254, 178, 76)"],
  [0.5, "rgb(253, 141, 60)"],
  [0.625, "rgb(252, 78, 42)"],
  [0.75, "rgb(227, 26, 28)"],
  [0.875, "rgb(189, 0, 38)"],
  [1, "rgb(128, 0, 38)"],
];

for (const [name, value] of Object.entries(COLORS)) {
  document.documentElement.style.setProperty(`--${name}`, value);
}

// The FLOPs counts keep their colour wherever they appear: "tflops_thd", "mfu_thd" -> "thd".
/** @param {string} metricName */
export function countColorOf(metricName) {
  /** @type {Record<string, string>} */
  const kinds = { bshd: "baseline", thd: "thd", useful: "useful" };
  const kind = kinds[metricName.split("_").at(-1) ?? ""];
  return kind && /^(tflops|mfu|flops)_/.test(metricName) ? kind : null;
}
