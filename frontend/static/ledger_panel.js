// @ts-check
// The loss ledger on a page (docs/ledger.md): the lead sentence (the largest loss, its fix, what
// removing it gains), the waterfall from the peak to the useful work, the table of every term
// (priced, or "not measured" with what would measure it), the baseline's over-count apart, and
// the tiles it flags. Figures are the API's (ledger.js derives the gains); raw values ride on
// data-value so that tests hold the page to the API.

import { COLORS } from "./colors.js";
import { el } from "./dom.js";
import { formatNumber } from "./format.js";
import { flaggedTiles, gainIfRemoved, largestLoss, shortLabel, unmeasured, waterfallBars } from "./ledger.js";

/** @typedef {import("./ledger.js").Ledger} Ledger @typedef {import("./ledger.js").LedgerTerm} LedgerTerm */

const NOT_MEASURED = "not measured";
export const ms = (/** @type {number | null} */ x) => (x === null ? NOT_MEASURED : `${formatNumber(".2f", x)} ms`);
export const pct = (/** @type {number | null} */ x) => (x === null ? NOT_MEASURED : `${formatNumber(".1f", x)}%`);
const hours = (/** @type {number | null} */ x) => (x === null ? NOT_MEASURED : formatNumber(".3g", x));
const mfuText = (/** @type {number | null} */ x) => (x === null ? "" : formatNumber(".1%", x));

// A cell with its shown text and the API's raw number (absent: "not measured").
const valueCell = (/** @type {string} */ text, /** @type {number | null} */ raw, /** @type {string} */ cls = "num") =>
  el("td", { class: raw === null ? `${cls} not-measured` : cls, "data-value": raw === null ? null : String(raw), text });

/** @param {Ledger} ledger */
export function leadText(ledger) {
  const lead = largestLoss(ledger);
  if (!lead) {
    const missing = unmeasured(ledger).map((t) => t.label);
    return {
      head: "No loss the loop can remove was measured above 0 in this window.",
      fix: missing.length ? `Not measured: ${missing.join(", ")}.` : "",
      gain: "",
    };
  }
  const gain = gainIfRemoved(ledger, lead);
  const mfu = gain && gain.mfu_before !== null ? `, useful MFU ${mfuText(gain.mfu_before)} → ${mfuText(gain.mfu_after)}` : "";
  return {
    head: `Largest loss: ${lead.label}, ${pct(lead.pct_of_step)} of the step (${ms(lead.ms_per_step)} a step, ${hours(lead.gpu_hours)} GPU-hours).`,
    fix: `What to change: ${lead.fix}${sitesText(lead) ? ` (${sitesText(lead)})` : ""}.`,
    gain: gain ? `If removed: step ${ms(ledger.step_time_ms)} → ${ms(gain.step_after_ms)} (${formatNumber(".3g", gain.speedup)}× faster)${mfu}.` : "",
  };
}

// The code sites a term names (host syncs: file:line, most frequent first), the first few.
const SITES_SHOWN = 3;
/** @param {LedgerTerm} term */
function sitesText(term) {
  /** @type {{ site: string, per_iter?: number | null }[]} */
  const sites = Array.isArray(term.detail?.sites) ? term.detail.sites : [];
  if (!sites.length) return "";
  const shown = sites.slice(0, SITES_SHOWN).map((s) => (s.per_iter == null ? s.site : `${s.site} (${formatNumber(".3g", s.per_iter)}/iteration)`));
  const more = sites.length > SITES_SHOWN ? ` and ${sites.length - SITES_SHOWN} more` : "";
  return `at ${shown.join(", ")}${more}`;
}

// A term's row: its label with its fix under it and how it is known (a priced term's basis in
// its title; an unpriced one says why, or what would measure it), then its prices (one "not
// measured" cell for an unpriced term, never 0) and the step time without it.
/** @param {Ledger} ledger @param {LedgerTerm} term */
function termRow(ledger, term) {
  const gain = term.loss && term.name !== "remainder" ? gainIfRemoved(ledger, term) : null;
  const priced = term.pct_of_step !== null;
  const head = el("th", { scope: "row" }, [
    el("span", { class: "term-label", text: term.label }),
    term.fix ? el("span", { class: "fix small", text: term.fix }) : null,
    sitesText(term) ? el("span", { class: "sites small", text: sitesText(term) }) : null,
    el("span", { class: "source small muted", text: priced ? term.status : `${term.status}: ${term.source}`, title: term.source }),
  ]);
  if (!priced) {
    return el("tr", { "data-term": term.name, class: "not-measured" }, [head, el("td", { class: "not-measured unpriced", colspan: 4, text: term.status })]);
  }
  return el("tr", { "data-term": term.name }, [
    head,
    valueCell(ms(term.ms_per_step), term.ms_per_step),
    valueCell(pct(term.pct_of_step), term.pct_of_step),
    valueCell(hours(term.gpu_hours), term.gpu_hours),
    el("td", { class: "num gain", text: gain ? ms(gain.step_after_ms) : "" }),
  ]);
}

// Colours by kind: losses the loop removes, what the kernels leave, what is not attributed.
const BAR_COLORS = { peak: COLORS.neutral, loss: COLORS.overcount, remainder: COLORS.remainder, unattributed: COLORS.unattributed, useful: COLORS.useful };

/** @param {HTMLElement} node @param {Ledger} ledger */
function drawWaterfall(node, ledger) {
  const bars = waterfallBars(ledger);
  const plotly = /** @type {any} */ (window).Plotly;
  if (!bars) {
    node.replaceChildren(el("p", { class: "empty-note muted", text: "No waterfall: the GPU's peak is not known (a CPU run, an unknown GPU), so no term is a share of it." }));
    return;
  }
  node.dataset.bars = JSON.stringify(bars.labels);
  if (!plotly) return;
  const hover = bars.terms.map((t, i) =>
    t ? `${t.label}: ${pct(t.pct_of_step)}<br>${ms(t.ms_per_step)} a step` : `not attributed: ${pct(-bars.values[i])}<br>left by the terms not measured`,
  );
  // Stacked bars, not plotly's waterfall trace: that one colours by sign, and a bar here is coloured
  // by what it is (a loss, what the kernels leave, what no measured term explains).
  const bases = [];
  const heights = [];
  let level = 0;
  for (const [i, measure] of bars.measures.entries()) {
    const v = bars.values[i];
    if (measure === "relative") {
      bases.push(level + v);
      heights.push(-v);
      level += v;
    } else {
      bases.push(0);
      heights.push(v);
      level = v;
    }
  }
  const base = { type: "bar", x: bars.labels, y: bases, marker: { color: "rgba(0,0,0,0)" }, hoverinfo: "skip", showlegend: false };
  const trace = {
    type: "bar",
    x: bars.labels,
    y: heights,
    marker: { color: bars.kinds.map((k) => BAR_COLORS[/** @type {keyof typeof BAR_COLORS} */ (k)]) },
    text: heights.map((v) => `${formatNumber(".1f", v)}%`),
    textposition: "outside",
    cliponaxis: false,
    hovertext: hover,
    hoverinfo: "text",
    showlegend: false,
  };
  const layout = {
    barmode: "stack",
    margin: { l: 48, r: 8, t: 16, b: 64 },
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
    font: { size: 11 },
    yaxis: { title: { text: "% of the step" }, range: [0, 112], gridcolor: "#e5e7eb", ticksuffix: "%", fixedrange: true },
    xaxis: { automargin: true, fixedrange: true },
    showlegend: false,
  };
  plotly.react(node, [base, trace], layout, { displayModeBar: false, responsive: true });
}
/** @param {Ledger} ledger */
function windowText(ledger) {
  const steps = ledger.first_step === ledger.last_step ? `step ${ledger.first_step}` : `steps ${ledger.first_step}–${ledger.last_step}`;
  const why = ledger.window === "steady" ? ", the first interval (warm-up) left out" : "";
  return ledger.first_step === null ? "no interval yet" : `${steps}${why}; step time ${ms(ledger.step_time_ms)}`;
}

/** @param {LedgerTerm} over */
function overcountText(over) {
  const value = over.detail?.overcount_pct;
  if (value === null || value === undefined) return `Baseline over-count: ${NOT_MEASURED} (${over.source}).`;
  return `Reporting error, not lost time: a baseline (dense BSHD-formula) logger would over-report this run's TFLOP/s by ${formatNumber(".1f", value)}%. ${over.fix ? `${over.fix[0].toUpperCase()}${over.fix.slice(1)}.` : ""}`;
}

// The tiles of `root` (data-stat) that the ledger flags get class "flagged" and their reason.
/** @param {ParentNode} root @param {Ledger} ledger */
export function flagTiles(root, ledger) {
  const flags = flaggedTiles(ledger);
  for (const node of /** @type {NodeListOf<HTMLElement>} */ (root.querySelectorAll("[data-stat]"))) {
    const why = flags.get(node.dataset.stat ?? "");
    node.classList.toggle("flagged", Boolean(why));
    let note = node.querySelector(".flag");
    if (why && !note) node.append((note = el("span", { class: "flag small" })));
    if (note) note.textContent = why ?? "";
    if (!why) note?.remove();
  }
}

// Fills a ledger card (templates: the run page's #ledger, the compare page's per-run cards).
/** @param {HTMLElement} card @param {Ledger} ledger */
export function renderLedger(card, ledger) {
  const lead = leadText(ledger);
  card.querySelector(".ledger-window").textContent = windowText(ledger);
  const parts = [el("strong", { text: lead.head })];
  if (lead.fix) parts.push(el("span", { class: "ledger-fix", text: ` ${lead.fix}` }));
  if (lead.gain) parts.push(el("span", { class: "ledger-gain", text: ` ${lead.gain}` }));
  card.querySelector(".ledger-lead").replaceChildren(...parts);
  const body = card.querySelector(".ledger-table tbody");
  body.replaceChildren(...ledger.terms.map((t) => termRow(ledger, t)));
  const missing = unmeasured(ledger);
  card.querySelector(".ledger-unmeasured").textContent = missing.length
    ? `Not measured (never shown as 0): ${missing.map((t) => t.label).join(", ")}; each row says what would measure it.`
    : "";
  card.querySelector(".ledger-overcount").textContent = overcountText(ledger.overcount);
  drawWaterfall(/** @type {HTMLElement} */ (card.querySelector(".ledger-plot")), ledger);
}

// Redraws the waterfall once plotly.js has loaded (the run page loads it after its first drawing).
/** @param {HTMLElement} card @param {Ledger} ledger */
export const redrawWaterfall = (card, ledger) => drawWaterfall(/** @type {HTMLElement} */ (card.querySelector(".ledger-plot")), ledger);

// The runs list's cell: the run's largest loss (RunSummary.largest_loss) and its share of the
// step, its fix in the title; "—" where no loss the loop removes was measured (never "0%").
/** @param {{ name: string, label: string, pct_of_step: number, fix: string } | null | undefined} loss */
export function largestLossCell(loss) {
  if (!loss) return el("td", { class: "largest-loss muted", text: "—", title: "no loss that a change to the loop removes was measured" });
  return el("td", { class: "largest-loss", "data-term": loss.name, "data-value": String(loss.pct_of_step), title: `${loss.label}: ${loss.fix}` }, [
    el("span", { class: "loss-name", text: shortLabel(loss) }),
    el("span", { class: "loss-pct", text: ` ${pct(loss.pct_of_step)}` }),
  ]);
}
