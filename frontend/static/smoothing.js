// @ts-check
// Exponential moving average as TensorBoard and W&B's classic smoothing draw it: debiased, so the
// first points are not pulled towards zero. A gap (null) stays a gap and does not count as a point.
/**
 * @param {(number | null)[]} values
 * @param {number} weight 0 (none) to below 1
 * @returns {(number | null)[]}
 */
export function ema(values, weight) {
  let last = 0;
  let seen = 0;
  return values.map((value) => {
    if (value === null || !Number.isFinite(value)) return null;
    last = last * weight + (1 - weight) * value;
    seen += 1;
    return last / (1 - weight ** seen);
  });
}
