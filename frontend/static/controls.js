// @ts-check
// The chart controls bar (x axis, log y, smoothing). Settings live in the query string, so a
// shared link reproduces them; a page reads them once, draws, and redraws on each change.

import { el } from "./dom.js";
import { localTime } from "./timeaxis.js";

// The x axes the series supports, each a column that xColumns adds to a series. "tokens seen" is
// Σ token slots up to each point; the time axes place a point at its wall-clock end (the series'
// wall_end_max, as step places it at its last step).
export const X_AXES = {
  step: { column: "step", title: "step" },
  tokens: { column: "tokens_seen", title: "tokens seen (token slots)" },
  wall: { column: "wall_time", title: "wall-clock time (this browser's time zone)", type: "date" },
  elapsed: { column: "elapsed_s", title: "relative time since the run's first interval (h:mm:ss)" },
};
const SMOOTHING_MAX = 0.99;

export function readSettings() {
  const params = new URLSearchParams(location.search);
  const x = params.get("x");
  const smoothing = Number(params.get("smooth") ?? 0);
  return {
    x: Object.hasOwn(X_AXES, x ?? "") ? x : "step",
    log: params.get("log") === "1",
    smoothing: Number.isFinite(smoothing) ? Math.min(Math.max(smoothing, 0), SMOOTHING_MAX) : 0,
  };
}

// Sets query parameters (an array repeats the key; null removes it) without a reload or a history entry.
export function updateQuery(values) {
  const params = new URLSearchParams(location.search);
  for (const [key, value] of Object.entries(values)) {
    params.delete(key);
    for (const item of value === null ? [] : [].concat(value)) params.append(key, item);
  }
  const query = params.toString();
  history.replaceState(null, "", query ? `${location.pathname}?${query}` : location.pathname);
}

// Defaults stay out of the URL, so a plain link stays plain.
function saveSettings(settings) {
  updateQuery({
    x: settings.x === "step" ? null : settings.x,
    log: settings.log ? "1" : null,
    smooth: settings.smoothing ? String(settings.smoothing) : null,
  });
}

// Σ tokens up to each point, continuing from `before` (the last sum of points already held).
export function tokensSeen(tokens, before = 0) {
  let sum = before;
  return tokens.map((value) => (sum += value ?? 0));
}

// The x columns of a series answer (docs/api.md, series) that are not in it: tokens seen
// (continuing from `tokensBefore`), the local wall-clock time and the seconds since the run's
// first interval began (`wall_origin`).
export function xColumns(series, tokensBefore = 0) {
  const ends = series.columns.wall_end_max;
  const origin = series.wall_origin;
  return {
    tokens_seen: tokensSeen(series.columns.tokens, tokensBefore),
    wall_time: ends.map((t) => (t === null ? null : localTime(t))),
    elapsed_s: ends.map((t) => (t === null || origin === null ? null : t - origin)),
  };
}

// Renders the bar into `container`; onChange(settings) runs after every change, at most once a frame.
export function renderControls(container, settings, onChange) {
  let pending = false;
  const changed = () => {
    saveSettings(settings);
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      onChange(settings);
    });
  };
  const xSelect = el(
    "select",
    { id: "x-axis", onchange: () => ((settings.x = xSelect.value), changed()) },
    Object.entries(X_AXES).map(([key, axis]) => el("option", { value: key, selected: key === settings.x, text: axis.title })),
  );
  const logBox = el("input", { type: "checkbox", id: "log-y", checked: settings.log, onchange: () => ((settings.log = logBox.checked), changed()) });
  const shown = el("output", { id: "smoothing-value", for: "smoothing", text: settings.smoothing.toFixed(2) });
  const slider = el("input", {
    type: "range",
    id: "smoothing",
    min: 0,
    max: SMOOTHING_MAX,
    step: 0.01,
    value: settings.smoothing,
    oninput: () => {
      settings.smoothing = Number(slider.value);
      shown.textContent = settings.smoothing.toFixed(2);
      changed();
    },
  });
  container.replaceChildren(
    el("label", {}, ["X axis ", xSelect]),
    el("label", {}, [logBox, " Log scale (y)"]),
    el("label", { title: "exponential moving average; the raw line stays, lighter" }, ["Smoothing ", slider, shown]),
  );
}
