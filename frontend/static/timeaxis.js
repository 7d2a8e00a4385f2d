// @ts-check
// The time x axes: wall-clock labels in the browser's time zone, and durations as h:mm:ss ticks
// (plotly has no duration axis, so the ticks are computed for the range on screen).

const pad = (/** @type {number} */ n, width = 2) => String(n).padStart(width, "0");

// Unix seconds as "YYYY-MM-DD HH:MM:SS.mmm" in local time: plotly draws such strings on a date
// axis as given (a number would be shown in UTC).
/** @param {number} seconds */
export function localTime(seconds) {
  const d = new Date(seconds * 1000);
  const date = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
  return `${date} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

// 3725 -> "1:02:05"; hours are not wrapped into days, so a week-long run reads "168:00:00".
/** @param {number} seconds */
export function hms(seconds) {
  const sign = seconds < 0 ? "−" : "";
  const whole = Math.round(Math.abs(seconds));
  return `${sign}${Math.floor(whole / 3600)}:${pad(Math.floor(whole / 60) % 60)}:${pad(whole % 60)}`;
}

const STEPS_S = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

// Tick values and h:mm:ss labels for [lo, hi] seconds: about `target` ticks on whole seconds,
// minutes or hours.
/**
 * @param {number} lo
 * @param {number} hi
 * @returns {{ tickvals: number[], ticktext: string[] }}
 */
export function durationTicks(lo, hi, target = 6) {
  if (!Number.isFinite(lo) || !Number.isFinite(hi) || hi < lo) return { tickvals: [], ticktext: [] };
  const span = Math.max(hi - lo, 1);
  const step = STEPS_S.find((s) => span / s <= target) ?? 86400 * Math.ceil(span / 86400 / target);
  const tickvals = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) tickvals.push(v);
  return { tickvals, ticktext: tickvals.map(hms) };
}
