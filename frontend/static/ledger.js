// @ts-check
// The loss ledger (GET /api/v1/runs/{id}/ledger, docs/ledger.md) as the pages read it: which loss
// leads, what removing it would gain, the waterfall's bars and which tiles it flags. Pure: every
// figure is the API's or follows from its figures by the arithmetic written here; a term without
// a value stays without one (never 0).

/**
 * @typedef {{ name: string, label: string, ms_per_step: number | null, pct_of_step: number | null,
 *   gpu_hours: number | null, status: string, source: string, fix: string, loss: boolean,
 *   detail: Record<string, any> }} LedgerTerm
 * @typedef {{ run_id: string, window: string, first_step: number | null, last_step: number | null,
 *   step_time_ms: number | null, gpu_hours: number | null, terms: LedgerTerm[], overcount: LedgerTerm }} Ledger
 */

// The share of the step past which a loss is worth a look: its tile is flagged.
export const FLAG_PCT = 5;
// What the kernels leave (no setting of the loop removes it): shown, never led with.
const REMAINDER = "remainder";

// Short names for a narrow column (the runs list).
/** @type {Record<string, string>} */
const SHORT = { host_syncs: "host syncs", launch_bound: "launch-bound" };
/** @param {{ name: string, label: string }} term */
export const shortLabel = (term) => SHORT[term.name] ?? term.label;

/** @param {number | null | undefined} x */
const known = (x) => x !== null && x !== undefined && Number.isFinite(x);

/** @param {Ledger} ledger @param {string} name */
export const termOf = (ledger, name) => ledger.terms.find((t) => t.name === name) ?? null;

// The losses a change to the loop removes, with a value, largest first (the API's order).
/** @param {Ledger} ledger */
export const fixableLosses = (ledger) =>
  ledger.terms.filter((t) => t.loss && t.name !== REMAINDER && known(t.pct_of_step) && /** @type {number} */ (t.pct_of_step) > 0);

/** @param {Ledger} ledger */
export const largestLoss = (ledger) => fixableLosses(ledger)[0] ?? null;

// Terms the ledger could not price: "not measured", each with what would measure it.
/** @param {Ledger} ledger */
export const unmeasured = (ledger) => ledger.terms.filter((t) => t.loss && t.status === "not measured");

// What removing `term` would give, everything else unchanged: the step shorter by its ms, the same
// useful FLOPs in that shorter step (useful MFU × old step ÷ new step).
/**
 * @param {Ledger} ledger
 * @param {LedgerTerm} term
 * @returns {{ saved_ms: number, step_after_ms: number, speedup: number, mfu_before: number | null, mfu_after: number | null } | null}
 */
export function gainIfRemoved(ledger, term) {
  const step = ledger.step_time_ms;
  const saved = term.ms_per_step;
  if (!known(step) || !known(saved) || /** @type {number} */ (saved) >= /** @type {number} */ (step)) return null;
  const before = /** @type {number} */ (step);
  const after = before - /** @type {number} */ (saved);
  const useful = termOf(ledger, "useful")?.pct_of_step;
  const mfu = known(useful) ? /** @type {number} */ (useful) / 100 : null;
  return { saved_ms: before - after, step_after_ms: after, speedup: before / after, mfu_before: mfu, mfu_after: mfu === null ? null : (mfu * before) / after };
}

// The loss an "after" run removed: of the "before" run's priced losses, the one whose ms per step
// fell most in the "after" run (a term the "after" did not price counts as not fallen); where
// none fell, the "before" run's largest loss.
/** @param {Ledger} before @param {Ledger} after */
export function fixedTerm(before, after) {
  let best = null;
  let drop = 0;
  for (const term of fixableLosses(before)) {
    const later = termOf(after, term.name)?.ms_per_step;
    if (!known(later)) continue;
    const fell = /** @type {number} */ (term.ms_per_step) - /** @type {number} */ (later);
    if (fell > drop) [best, drop] = [term, fell];
  }
  return best ?? largestLoss(before);
}

// A before/after pair: the gain the "before" ledger predicts for the loss the "after" removed
// (its share of the "before" step), next to the gain realized (the step times' difference, as
// a share of the "before" step).
/**
 * @param {Ledger} before
 * @param {Ledger} after
 * @returns {{ term: LedgerTerm | null, predicted_pct: number | null, realized_pct: number | null }}
 */
export function predictedVsRealized(before, after) {
  const term = fixedTerm(before, after);
  const predicted = term && known(term.pct_of_step) ? term.pct_of_step : null;
  const b = before.step_time_ms;
  const a = after.step_time_ms;
  const realized = known(b) && known(a) && /** @type {number} */ (b) > 0 ? (100 * (/** @type {number} */ (b) - /** @type {number} */ (a))) / /** @type {number} */ (b) : null;
  return { term, predicted_pct: predicted, realized_pct: realized };
}

// The waterfall, in % of the step: the peak (100), each loss with a value down from it, what the
// named terms leave unexplained while some are not measured ("not attributed"), the useful work.
// Its bars' values sum from the peak to the useful work, so the plot never invents a term.
/**
 * @param {Ledger} ledger
 * @returns {{ labels: string[], measures: string[], values: number[], kinds: string[], terms: (LedgerTerm | null)[] } | null}
 */
export function waterfallBars(ledger) {
  const peak = termOf(ledger, "peak");
  const useful = termOf(ledger, "useful");
  if (!peak || !useful || !known(peak.pct_of_step) || !known(useful.pct_of_step)) return null;
  const losses = ledger.terms.filter((t) => t.loss && known(t.pct_of_step) && /** @type {number} */ (t.pct_of_step) > 0);
  /** @type {{ labels: string[], measures: string[], values: number[], kinds: string[], terms: (LedgerTerm | null)[] }} */
  const bars = { labels: [peak.label], measures: ["absolute"], values: [/** @type {number} */ (peak.pct_of_step)], kinds: ["peak"], terms: [peak] };
  let left = /** @type {number} */ (peak.pct_of_step);
  for (const term of losses) {
    bars.labels.push(term.label);
    bars.measures.push("relative");
    bars.values.push(-(/** @type {number} */ (term.pct_of_step)));
    bars.kinds.push(term.name === REMAINDER ? "remainder" : "loss");
    bars.terms.push(term);
    left -= /** @type {number} */ (term.pct_of_step);
  }
  const gap = left - /** @type {number} */ (useful.pct_of_step);
  if (Math.abs(gap) > 1e-9) {
    bars.labels.push("not attributed");
    bars.measures.push("relative");
    bars.values.push(-gap);
    bars.kinds.push("unattributed");
    bars.terms.push(null);
  }
  bars.labels.push(useful.label);
  bars.measures.push("total");
  bars.values.push(/** @type {number} */ (useful.pct_of_step));
  bars.kinds.push("useful");
  bars.terms.push(useful);
  return bars;
}

// The run page's tiles that the ledger flags, each with why: a loss worth a look, host syncs
// counted at all (each one stalls the host), a baseline that over-reports.
/**
 * @param {Ledger} ledger
 * @returns {Map<string, string>} tile (catalogue metric) -> why it is flagged
 */
export function flaggedTiles(ledger) {
  /** @type {Map<string, string>} */
  const flags = new Map();
  const pct = (/** @type {LedgerTerm} */ t) => (known(t.pct_of_step) ? /** @type {number} */ (t.pct_of_step) : null);
  const syncs = termOf(ledger, "host_syncs");
  const perIter = syncs?.detail?.syncs_per_iter;
  if (known(perIter) && perIter > 0) flags.set("syncs_per_iter", `${perIter.toPrecision(3)} host syncs per iteration: each one stalls the host until the GPU catches up`);
  const padding = termOf(ledger, "padding");
  const paddingPct = padding && pct(padding);
  if (padding && paddingPct !== null && paddingPct >= FLAG_PCT) flags.set("padding_pct", `padding costs ${paddingPct.toFixed(1)}% of the step`);
  const late = ["stragglers", "data_wait", "launch_bound"].map((name) => termOf(ledger, name)).filter((t) => t && (pct(t) ?? 0) >= FLAG_PCT);
  if (late.length) flags.set("step_time_s", late.map((t) => `${t?.label} ${pct(/** @type {LedgerTerm} */ (t))?.toFixed(1)}% of the step`).join("; "));
  const over = ledger.overcount?.detail?.overcount_pct;
  if (known(over) && over >= FLAG_PCT) flags.set("overcount_pct", `a baseline logger over-reports this run's TFLOP/s by ${over.toFixed(1)}%: a reporting error, not lost time`);
  return flags;
}
