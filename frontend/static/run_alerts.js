// @ts-check
// The run page's alerts (docs/alerts.md): the server renders the banner of open alerts and the
// history; this keeps both current, asking GET /api/v1/runs/{id}/alerts every REFRESH_MS.
import { el } from "./dom.js";

const REFRESH_MS = 10000;

/**
 * @typedef {{rule: string, subject: string, opened_at: string, resolved_at: string | null,
 *   summary: string, ledger_term: string | null}} Alert
 */

/** @param {string} iso */
const utc = (iso) => iso.slice(0, 19).replace("T", " ");

/** @param {Alert} a */
function openItem(a) {
  const when = `since ${utc(a.opened_at)} UTC${a.ledger_term ? ` · ledger term: ${a.ledger_term}` : ""}`;
  return el("li", { "data-rule": a.rule }, [
    el("span", { class: "badge alert-rule", text: a.rule }),
    a.subject ? " " : null,
    a.subject ? el("code", { text: a.subject }) : null,
    ` ${a.summary} `,
    el("span", { class: "muted small", text: when }),
  ]);
}

/** @param {Alert} a */
function historyRow(a) {
  const cells = [a.rule, a.subject || "—", utc(a.opened_at), a.resolved_at ? utc(a.resolved_at) : "open", a.summary];
  return el("tr", {}, cells.map((text) => el("td", { text })));
}

/** @param {Alert[]} alerts */
function render(alerts) {
  const open = alerts.filter((a) => a.resolved_at === null);
  const banner = /** @type {HTMLElement} */ (document.getElementById("alerts-banner"));
  banner.hidden = open.length === 0;
  /** @type {HTMLElement} */ (document.getElementById("alerts-count")).textContent =
    `${open.length} open alert${open.length === 1 ? "" : "s"}`;
  /** @type {HTMLElement} */ (document.getElementById("alerts-open")).replaceChildren(...open.map(openItem));
  const history = /** @type {HTMLElement} */ (document.getElementById("alerts-history"));
  history.hidden = alerts.length === 0;
  /** @type {HTMLElement} */ (document.getElementById("alerts-total")).textContent = String(alerts.length);
  /** @type {HTMLElement} */ (document.getElementById("alerts-history-body")).replaceChildren(...alerts.map(historyRow));
}

async function refresh() {
  const runId = /** @type {HTMLElement} */ (document.getElementById("run")).dataset.runId ?? "";
  try {
    const answer = await fetch(`/api/v1/runs/${encodeURIComponent(runId)}/alerts`, { credentials: "same-origin" });
    if (answer.ok) render(await answer.json());
  } catch {
    // the next round tries again; the page's other requests say when the server is away
  }
}

setInterval(refresh, REFRESH_MS);
