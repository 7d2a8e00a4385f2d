// @ts-check
// What a live event adds to a drawn series chart: for each trace plotly holds, the points of the
// held columns from index `from` on (Plotly.extendTraces' update), so the chart grows by what
// arrived instead of being drawn anew. A smoothed line's new points are the tail of the EMA over
// the whole grown column, the values a full drawing of the grown series gives them. And which new
// parts of the series the events carry themselves (carriedParts), so that none is asked for.

import { ema } from "./smoothing.js";

/**
 * @typedef {{ last_step?: unknown, after_step?: unknown, series?: { points: number } }} LiveEvent
 * @typedef {{ meta?: { column?: string, kind?: string }, x?: unknown[], visible?: unknown }} DrawnTrace
 * @typedef {{ update: { x: unknown[][], y: unknown[][] }, indices: number[] }} Extension
 */

/**
 * The column a band edge's column (`<column>_max` or `_min`) shades; any other column itself.
 * @param {string} edge
 */
export const bandBase = (edge) => edge.replace(/_(max|min)$/, "");

/**
 * Whether the min–max band of a band edge's column has a width at some point from index `from`
 * on: a point of one interval has none, and its band hides under the line.
 * @param {Record<string, (number | string | null)[]>} columns
 * @param {string} edge
 */
export function bandHasWidth(columns, edge, from = 0) {
  const base = bandBase(edge);
  const [max, min] = [columns[`${base}_max`] ?? [], columns[`${base}_min`] ?? []];
  for (let i = from; i < max.length; i++) {
    const [hi, lo] = [max[i], min[i]];
    if (hi !== null && lo != null && hi > lo) return true;
  }
  return false;
}

/**
 * @param {DrawnTrace[]} drawn the plot's traces (plotly's gd.data), each naming its column in meta
 * @param {Record<string, (number | string | null)[]>} columns the held series, grown
 * @param {number} from how many points of the columns the traces hold
 * @param {string} xColumn the column on the x axis
 * @param {number} smoothing the EMA weight of smoothed traces (0: none)
 * @returns {Extension | null} null where a trace's column is not held or does not end at
 *   `from` points drawn, or a band left undrawn for having no width gains one: the chart must be
 *   drawn anew
 */
export function extension(drawn, columns, from, xColumn, smoothing) {
  const xs = columns[xColumn];
  if (!xs || from > xs.length) return null;
  /** @type {Extension} */
  const out = { update: { x: [], y: [] }, indices: [] };
  for (const [i, trace] of drawn.entries()) {
    const column = trace.meta?.column;
    const values = column === undefined ? undefined : columns[column];
    if (!values || values.length !== xs.length || trace.x?.length !== from) return null;
    const hidden = trace.visible === false && trace.meta?.kind === "band";
    if (hidden && bandHasWidth(columns, /** @type {string} */ (column), from)) return null;
    const shown = trace.meta?.kind === "smoothed" ? ema(/** @type {(number | null)[]} */ (values), smoothing) : values;
    out.update.x.push(xs.slice(from));
    out.update.y.push(shown.slice(from));
    out.indices.push(i);
  }
  return out;
}

// The new parts of the series that live events carry (docs/api.md, the stream: each event's
// series covers the steps after its after_step up to its last_step), in order, where they continue
// what the page holds up to `lastStep` one after the other; an event announcing nothing past it is
// passed over. null where one does not continue it (a gap after a reconnect, more intervals than
// an event carries, an event not read) or there is no event (the status poll): the page then asks
// for the series.
/**
 * @template {LiveEvent} E
 * @param {(E | null)[]} events the events not taken yet, in the order they came
 * @param {number} lastStep the last step of the series held
 * @returns {NonNullable<E["series"]>[] | null}
 */
export function carriedParts(events, lastStep) {
  if (!events.length) return null;
  /** @type {NonNullable<E["series"]>[]} */
  const parts = [];
  let held = lastStep;
  for (const event of events) {
    if (event === null || typeof event.last_step !== "number") return null;
    if (event.last_step <= held) continue;
    if (!event.series || event.after_step !== held) return null;
    parts.push(/** @type {NonNullable<E["series"]>} */ (event.series));
    held = event.last_step;
  }
  return parts;
}
