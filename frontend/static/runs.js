// Runs page: the run table, refreshed every 5 s so live status shows; pick runs to compare.
// Metric columns are declared in the template (th[data-metric]); labels and formats come from the catalogue.

import * as api from "./api.js";
import { loadCatalogue, metricOf } from "./catalogue.js";
import { metricLabel, renderDefinitions } from "./definitions.js";
import { count, display } from "./format.js";
import { el, showError, statusBadge } from "./dom.js";

const REFRESH_MS = 5000;
const selected = new Set();
const body = document.getElementById("runs-body");
const compareButton = document.getElementById("compare");
const metricHeads = [...document.querySelectorAll("#runs-table th[data-metric]")];
const columnCount = document.querySelectorAll("#runs-table thead th").length;
let metrics = [];

function updateCompareButton() {
  compareButton.disabled = selected.size < 2;
  compareButton.textContent = selected.size ? `Compare selected (${selected.size})` : "Compare selected";
}

function checkbox(runId) {
  return el("input", {
    type: "checkbox",
    "aria-label": `select ${runId}`,
    checked: selected.has(runId),
    onchange: (event) => {
      if (event.target.checked) selected.add(runId);
      else selected.delete(runId);
      updateCompareButton();
    },
  });
}

function row(run) {
  const totals = run.totals || {};
  const cell = (text, cls = "num") => el("td", { class: cls, text });
  return el("tr", { "data-run-id": run.run_id }, [
    el("td", { class: "check" }, checkbox(run.run_id)),
    el("td", {}, [
      el("a", { href: api.runPageUrl(run.run_id), text: run.name || run.run_id }),
      el("div", { class: "muted small", text: run.run_id }),
    ]),
    cell(run.project || "—", ""),
    cell(run.layout, ""),
    el("td", {}, statusBadge(run.status)),
    cell(count(run.last_step)),
    ...metrics.map((metric, i) => cell(display(metric, totals[metric.name]), metricHeads[i].className)),
  ]);
}

function render(runs) {
  // Forget selections of runs that are gone, so the button count stays honest.
  const ids = new Set(runs.map((run) => run.run_id));
  for (const id of selected) if (!ids.has(id)) selected.delete(id);
  updateCompareButton();
  if (!runs.length) {
    const hint = "No runs yet. Runs appear here as soon as a trainer with the packscope agent starts.";
    body.replaceChildren(el("tr", { class: "placeholder" }, el("td", { colspan: columnCount, text: hint })));
    return;
  }
  body.replaceChildren(...runs.map(row));
}

async function refresh() {
  try {
    const { runs } = await api.listRuns();
    render(runs);
    showError(null);
    document.getElementById("refreshed").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    showError(error);
  }
}

compareButton.addEventListener("click", () => {
  const params = new URLSearchParams([...selected].map((id) => ["run_id", id]));
  window.location.href = `/compare?${params}`;
});

async function start() {
  try {
    const catalogue = await loadCatalogue();
    metrics = metricHeads.map((th) => metricOf(catalogue, th.dataset.metric));
    metricHeads.forEach((th, i) => th.replaceChildren(metricLabel(metrics[i])));
    renderDefinitions(catalogue, metrics.map((metric) => metric.name));
  } catch (error) {
    return showError(error);
  }
  refresh();
  // A hidden tab does not need fresh numbers; it catches up when shown again.
  setInterval(() => document.hidden || refresh(), REFRESH_MS);
  document.addEventListener("visibilitychange", () => document.hidden || refresh());
}

start();
