// @ts-check
// The run page's ledger card and the tiles it flags: fetched with the page's summary, its
// waterfall drawn once plotly.js has loaded (run_early.js's plotlyLoaded).

import { getLedger } from "./api.js";
import { flagTiles, redrawWaterfall, renderLedger } from "./ledger_panel.js";

/** @type {import("./ledger.js").Ledger | null} */
let shown = null;

// Fetches and shows the run's ledger; `plotly` resolves once plotly.js can draw the waterfall.
/** @param {string} runId @param {Promise<unknown>} plotly */
export async function showRunLedger(runId, plotly) {
  const card = /** @type {HTMLElement} */ (document.getElementById("ledger"));
  const ledger = await getLedger(runId);
  const first = shown === null;
  shown = ledger;
  renderLedger(card, ledger);
  flagTiles(document.getElementById("totals") ?? document, ledger);
  if (first) plotly.then(() => shown && redrawWaterfall(card, shown));
}
