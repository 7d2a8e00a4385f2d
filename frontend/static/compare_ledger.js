// @ts-check
// The compare page's ledgers (docs/ledger.md): for two runs, each run's ledger side by side and,
// taking the first run as the "before" (the page's reference), the gain its ledger predicts for
// the loss the second run removed next to the gain the second run realized.

import { getLedger } from "./api.js";
import { el } from "./dom.js";
import { gainIfRemoved, predictedVsRealized } from "./ledger.js";
import { ms, pct, renderLedger } from "./ledger_panel.js";

/** @typedef {import("./ledger.js").Ledger} Ledger */

/** @param {Ledger} before @param {Ledger} after @param {string[]} names */
function pairRows(before, after, names) {
  const { term, predicted_pct: predicted, realized_pct: realized } = predictedVsRealized(before, after);
  const gain = term ? gainIfRemoved(before, term) : null;
  const predictedText = predicted === null ? "not measured" : `${pct(predicted)} of the step (${ms(before.step_time_ms)} → ${ms(gain?.step_after_ms ?? null)})`;
  const realizedText = realized === null ? "not measured" : `${pct(realized)} of the step (${ms(before.step_time_ms)} → ${ms(after.step_time_ms)})`;
  return [
    el("tr", { "data-row": "fix" }, [el("th", { scope: "row", text: "The fix" }), el("td", { text: term ? `${term.label}: ${term.fix}` : "no loss priced in the first run" })]),
    el("tr", { "data-row": "predicted" }, [
      el("th", { scope: "row", text: `Predicted by ${names[0]}'s ledger` }),
      el("td", { "data-value": predicted === null ? null : String(predicted), text: predictedText }),
    ]),
    el("tr", { "data-row": "realized" }, [
      el("th", { scope: "row", text: `Realized by ${names[1]}` }),
      el("td", { "data-value": realized === null ? null : String(realized), text: realizedText }),
    ]),
  ];
}

// Shown for exactly two runs (`names`: as the page labels them); hidden otherwise.
/** @param {string[]} runIds @param {string[]} names */
export async function showCompareLedgers(runIds, names) {
  const section = /** @type {HTMLElement} */ (document.getElementById("ledgers"));
  if (runIds.length !== 2) {
    section.hidden = true;
    return;
  }
  const [before, after] = /** @type {Ledger[]} */ (await Promise.all(runIds.map((id) => getLedger(id))));
  section.hidden = false;
  document.querySelector("#ledger-pair tbody")?.replaceChildren(...pairRows(before, after, names));
  for (const [i, ledger] of [before, after].entries()) {
    const card = /** @type {HTMLElement} */ (document.getElementById(`ledger-${i}`));
    card.querySelector("h2").textContent = `${names[i]}: where the step time goes`;
    renderLedger(card, ledger);
  }
}
