// @ts-check
// Per-channel loss as series columns: the series answer's channel_loss {channel: [per point]}
// becomes columns "channel_loss:<channel>", so the charts fill them like any other column.

export const CHANNEL_PREFIX = "channel_loss:";

export const isChannel = (/** @type {string} */ column) => column.startsWith(CHANNEL_PREFIX);
export const channelOf = (/** @type {string} */ column) => column.slice(CHANNEL_PREFIX.length);

/**
 * @param {{ channel_loss?: Record<string, (number | null)[]> }} series
 * @returns {Record<string, (number | null)[]>}
 */
export function channelColumns(series) {
  return Object.fromEntries(Object.entries(series.channel_loss || {}).map(([name, values]) => [CHANNEL_PREFIX + name, values]));
}

// The catalogue's loss entry (format, unit) under the channel's name.
export const channelMetric = (/** @type {Metric} */ loss, /** @type {string} */ column) => ({ ...loss, name: column, label: `loss · ${channelOf(column)}` });

// Appends a fresh part of a series to held columns; a channel that one side lacks is null there.
/**
 * @param {Record<string, unknown[]>} held
 * @param {number} heldPoints
 * @param {Record<string, unknown[]>} fresh
 * @param {number} freshPoints
 */
export function appendColumns(held, heldPoints, fresh, freshPoints) {
  for (const name of new Set([...Object.keys(held), ...Object.keys(fresh)])) {
    if (!(name in held)) held[name] = new Array(heldPoints).fill(null);
    held[name].push(...(fresh[name] ?? new Array(freshPoints).fill(null)));
  }
}
