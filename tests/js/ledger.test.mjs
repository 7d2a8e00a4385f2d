// ledger.js: the largest loss, the gain of removing a term, the waterfall's bars and the flagged
// tiles, on ledgers written out by hand (the API's shape, docs/ledger.md).
import assert from "node:assert/strict";
import { test } from "node:test";

import { fixedTerm, flaggedTiles, gainIfRemoved, largestLoss, predictedVsRealized, unmeasured, waterfallBars } from "../../frontend/static/ledger.js";

const term = (name, pct, extra = {}) => ({
  name,
  label: name.replace("_", " "),
  ms_per_step: pct === null ? null : pct, // a 100 ms step: a percent is that many ms
  pct_of_step: pct,
  gpu_hours: pct === null ? null : pct / 1000,
  status: pct === null ? "not measured" : "measured",
  source: pct === null ? "a host timer would" : "sums",
  fix: `fix ${name}`,
  loss: !["peak", "useful"].includes(name),
  detail: {},
  ...extra,
});

// Peak 100; padding 30, syncs 12 (20 a step), stragglers not applicable, data wait not measured;
// the useful work 25: 33 of the step no measured term explains.
const ledger = (overrides = {}) => ({
  run_id: "r",
  window: "steady",
  first_step: 11,
  last_step: 40,
  step_time_ms: 100,
  gpu_hours: 0.1,
  terms: [
    term("peak", 100),
    term("padding", 30),
    term("host_syncs", 12, { detail: { syncs_per_iter: 20 } }),
    term("stragglers", null, { status: "not applicable" }),
    term("data_wait", null),
    term("remainder", null),
    term("useful", 25),
  ],
  overcount: term("overcount", null, { detail: { overcount_pct: 18 }, loss: false }),
  ...overrides,
});

test("the largest loss is the largest priced one the loop can remove, never the rest", () => {
  assert.equal(largestLoss(ledger()).name, "padding");
  const kernels = ledger();
  kernels.terms.splice(5, 1, term("remainder", 40));
  assert.equal(largestLoss(kernels).name, "padding");
  const none = ledger({ terms: [term("peak", 100), term("padding", 0), term("data_wait", null), term("useful", 25)] });
  assert.equal(largestLoss(none), null);
  assert.deepEqual(unmeasured(none).map((t) => t.name), ["data_wait"]); // never a 0
});

test("removing a term shortens the step by its ms and raises the useful MFU in proportion", () => {
  const gain = gainIfRemoved(ledger(), ledger().terms[1]);
  assert.equal(gain.saved_ms, 30);
  assert.equal(gain.step_after_ms, 70);
  assert.equal(gain.speedup, 100 / 70);
  assert.equal(gain.mfu_before, 0.25);
  assert.ok(Math.abs(gain.mfu_after - 0.25 / 0.7) < 1e-12);
  assert.equal(gainIfRemoved(ledger(), term("data_wait", null)), null);
});

test("a before/after pair: the before's largest loss predicted, the step times realized", () => {
  const after = ledger({ step_time_ms: 75 });
  const pair = predictedVsRealized(ledger(), after);
  assert.equal(pair.term.name, "padding");
  assert.equal(pair.predicted_pct, 30);
  assert.equal(pair.realized_pct, 25);
  assert.equal(predictedVsRealized(ledger(), ledger({ step_time_ms: null })).realized_pct, null);
});

test("the fix a pair made is the before's loss that fell most, else its largest", () => {
  const synced = ledger();
  synced.terms[2] = term("host_syncs", 12, { detail: { syncs_per_iter: 20 } });
  const noSyncs = ledger();
  noSyncs.terms[2] = term("host_syncs", 0, { detail: { syncs_per_iter: 0 } });
  assert.equal(fixedTerm(synced, noSyncs).name, "host_syncs"); // padding unchanged, syncs fell by 12 ms
  const pair = predictedVsRealized(synced, { ...noSyncs, step_time_ms: 90 });
  assert.equal(pair.predicted_pct, 12);
  assert.equal(pair.realized_pct, 10);
  assert.equal(fixedTerm(ledger(), ledger()).name, "padding"); // nothing fell: the largest
});

test("the waterfall walks from the peak through the priced losses and what is unattributed to the useful work", () => {
  const bars = waterfallBars(ledger());
  assert.deepEqual(bars.labels, ["peak", "padding", "host syncs", "not attributed", "useful"]);
  assert.deepEqual(bars.measures, ["absolute", "relative", "relative", "relative", "total"]);
  assert.deepEqual(bars.values, [100, -30, -12, -33, 25]);
  assert.deepEqual(bars.kinds, ["peak", "loss", "loss", "unattributed", "useful"]);
  // Every term priced: nothing left unattributed.
  const whole = ledger();
  whole.terms.splice(5, 1, term("remainder", 33));
  assert.deepEqual(waterfallBars(whole).labels, ["peak", "padding", "host syncs", "remainder", "useful"]);
  // No peak (a CPU run): no waterfall.
  assert.equal(waterfallBars(ledger({ terms: [term("peak", null), term("padding", 30), term("useful", null)] })), null);
});

test("tiles are flagged for syncs counted at all, a loss of 5% or more and an over-reporting baseline", () => {
  const flags = flaggedTiles(ledger());
  assert.deepEqual([...flags.keys()].sort(), ["overcount_pct", "padding_pct", "syncs_per_iter"]);
  assert.match(flags.get("syncs_per_iter"), /^20\.0 host syncs per iteration/);
  const quiet = ledger({
    terms: [term("peak", 100), term("padding", 4), term("host_syncs", 0, { detail: { syncs_per_iter: 0 } }), term("useful", 25)],
    overcount: term("overcount", null, { detail: { overcount_pct: 2 }, loss: false }),
  });
  assert.deepEqual([...flaggedTiles(quiet).keys()], []);
  const late = ledger({ terms: [term("peak", 100), term("data_wait", 9), term("useful", 25)] });
  assert.deepEqual([...flaggedTiles(late).keys()], ["step_time_s", "overcount_pct"]);
});
