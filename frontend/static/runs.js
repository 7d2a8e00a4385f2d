// @ts-check
// Runs page: the runs table (docs/api.md, GET /api/v1/runs), sorted, filtered, searched and paged
// by the server; refreshed every 5 s so live status shows (stale and crashed: runs whose agent
// stopped calling); pick runs to compare; rename, tag, annotate, archive and delete runs. The
// default metric columns are declared in the template (th[data-metric]); the column chooser picks
// any catalogue metric instead, and runs can be grouped by a config key or tag (each group's mean
// and min–max per column). Labels and formats come from the catalogue. The view (sort, filters,
// page, columns, grouping) lives in the URL. The project and tag menus list what the runs carry
// (GET /api/v1/facets), refreshed with the table.

import * as api from "./api.js";
import { loadCatalogue, metricOf } from "./catalogue.js";
import { metricLabel, renderDefinitions } from "./definitions.js";
import { ask, setDialogError } from "./dialog.js";
import { el, showError } from "./dom.js";
import { count, display } from "./format.js";
import { BUILT_IN_KEYS, configKeyOf, flatKeys, groupsOf, isConfigKey, keyLabel, spread } from "./groups.js";
import { statusCell } from "./run_facts.js";
import { listRuns, write } from "./runs_api.js";

const REFRESH_MS = 5000;
const SEARCH_DEBOUNCE_MS = 300;
const PAGE_SIZE = 50;
const DEFAULT_SORT = "-started_at";
const FILTERS = ["q", "project", "tag", "layout", "status"];

const selected = new Set();
const body = document.getElementById("runs-body");
const compareButton = /** @type {HTMLButtonElement} */ (document.getElementById("compare"));
const headRow = document.querySelector("#runs-table thead tr");
// The template's metric columns are the default ones; the chooser replaces them (cols= in the URL).
const DEFAULT_COLUMNS = [.../** @type {NodeListOf<HTMLElement>} */ (headRow.querySelectorAll("th[data-metric]"))].map((th) => th.dataset.metric);
const HEADLINE = DEFAULT_COLUMNS[0];
let metricHeads = [];
const columnCount = () => headRow.querySelectorAll("th").length;
const dialogs = {
  edit: /** @type {HTMLDialogElement} */ (document.getElementById("edit-dialog")),
  remove: /** @type {HTMLDialogElement} */ (document.getElementById("delete-dialog")),
  token: /** @type {HTMLDialogElement} */ (document.getElementById("token-dialog")),
};
let metrics = [];
let catalogue = null; // loaded once at start
let lastPage = null; // the last answer, so a change of columns or grouping redraws without a fetch
const configKeys = new Set(); // config keys seen in the runs' configs: the group-by suggestions
let editing = 0; // inline renames and dialogs open: refreshes wait, so nothing is redrawn under the user
let generation = 0; // answers of superseded requests are dropped

const view = readView();

function readView() {
  const params = new URLSearchParams(window.location.search);
  const out = { sort: params.get("sort") || DEFAULT_SORT, offset: Math.max(0, Number(params.get("offset")) || 0) };
  for (const key of FILTERS) out[key] = params.get(key) || "";
  out.archived = params.get("archived") === "true";
  out.alerts = params.get("alerts") === "open"; // only the runs with an open alert
  out.cols = params.get("cols") ? params.get("cols").split(",").filter(Boolean) : null; // null: the defaults
  out.group = params.get("group") || "";
  return out;
}

function writeView() {
  const params = new URLSearchParams();
  if (view.sort !== DEFAULT_SORT) params.set("sort", view.sort);
  for (const key of FILTERS) if (view[key]) params.set(key, view[key]);
  if (view.archived) params.set("archived", "true");
  if (view.alerts) params.set("alerts", "open");
  if (view.offset) params.set("offset", String(view.offset));
  if (view.cols) params.set("cols", view.cols.join(","));
  if (view.group) params.set("group", view.group);
  const text = params.toString();
  history.replaceState(null, "", text ? `?${text}` : window.location.pathname);
}

// -- selection ----------------------------------------------------------------------------------
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

compareButton.addEventListener("click", () => {
  const params = new URLSearchParams([...selected].map((id) => ["run_id", id]));
  window.location.href = `/compare?${params}`;
});

// -- edits --------------------------------------------------------------------------------------
const displayName = (run) => run.name || run.run_id;

async function askToken(wasWrong) {
  const dialog = dialogs.token;
  const answer = await held(() =>
    ask(dialog, {
      onOpen: () => {
        /** @type {HTMLInputElement} */ (dialog.querySelector("#token-input")).value = "";
        setDialogError(dialog, wasWrong ? "That token was refused; try again." : null);
      },
    }),
  );
  const token = /** @type {HTMLInputElement} */ (dialog.querySelector("#token-input")).value.trim();
  return answer === "ok" && token ? token : null;
}

async function held(action) {
  editing++;
  try {
    return await action();
  } finally {
    editing--;
  }
}

// Which kind of error the box shows: the table's refresh clears only its own ("load"), so a refused
// edit stays on screen until the next edit instead of vanishing with the refresh that follows it.
let shownError = null;
function report(kind, error) {
  if (!error && shownError !== kind) return;
  shownError = error ? kind : null;
  showError(error, kind === "edit" ? "" : undefined);
}

async function save(method, run, patch) {
  try {
    await write(method, run.run_id, patch, askToken);
    report("edit", null);
    return true;
  } catch (error) {
    report("edit", error);
    return false;
  } finally {
    refresh();
  }
}

function startRename(run, cell) {
  editing++;
  let finished = false;
  const input = el("input", { type: "text", class: "rename", value: run.name || "", maxlength: 200, "aria-label": `new name of ${run.run_id}` });
  const finish = async (keep) => {
    if (finished) return;
    finished = true;
    editing--;
    const name = input.value.trim();
    if (keep && name !== (run.name || "")) await save("PATCH", run, { name: name || null });
    else refresh();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") finish(true);
    else if (event.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(true));
  cell.querySelector(".run-title").replaceChildren(input);
  input.focus();
  input.select();
}

const parseTags = (text) => [...new Set(text.split(",").map((t) => t.trim()).filter(Boolean))];

async function editDetails(run) {
  const dialog = dialogs.edit;
  const answer = await held(() =>
    ask(dialog, {
      onOpen: () => {
        dialog.querySelector(".run-name").textContent = displayName(run);
        /** @type {HTMLInputElement} */ (dialog.querySelector("#edit-tags")).value = run.tags.join(", ");
        /** @type {HTMLTextAreaElement} */ (dialog.querySelector("#edit-notes")).value = run.notes || "";
        setDialogError(dialog, null);
      },
    }),
  );
  if (answer !== "save") return;
  const tags = parseTags(/** @type {HTMLInputElement} */ (dialog.querySelector("#edit-tags")).value);
  if (tags.length > 50 || tags.some((t) => t.length > 100)) {
    return report("edit", new Error("not saved: at most 50 tags of at most 100 characters each"));
  }
  await save("PATCH", run, { tags, notes: /** @type {HTMLTextAreaElement} */ (dialog.querySelector("#edit-notes")).value });
}

async function confirmDelete(run) {
  const dialog = dialogs.remove;
  const answer = await held(() =>
    ask(dialog, {
      onOpen: () => {
        for (const node of dialog.querySelectorAll(".run-name")) node.textContent = displayName(run);
        dialog.querySelector(".run-id").textContent = run.run_id;
      },
    }),
  );
  if (answer !== "delete") return;
  selected.delete(run.run_id);
  await save("DELETE", run);
}

// -- rows ---------------------------------------------------------------------------------------
const SHOWN_TAGS = 2; // tags shown as chips on a row's one line; "+N" stands for the rest

function actionButton(text, label, onclick) {
  return el("button", { type: "button", class: "link-button", text, "aria-label": label, onclick });
}

// A row's actions behind one "⋯" button, so they take no width of their own. While open, the
// table is not redrawn under it (the refresh waits, as for a rename).
function actionsMenu(run, actions) {
  const menu = el("details", { class: "row-menu" }, [
    el("summary", { class: "link-button", text: "⋯", "aria-label": `actions of ${run.run_id}`, title: "edit, archive, delete" }),
    el("div", { class: "menu card", role: "menu" }, actions.map(([text, label, action]) =>
      actionButton(text, label, () => {
        menu.open = false;
        action();
      }),
    )),
  ]);
  menu.addEventListener("toggle", () => (menu.open ? editing++ : editing--));
  menu.addEventListener("keydown", (event) => {
    if (event.key === "Escape") menu.open = false;
  });
  return menu;
}

// A click anywhere else closes an open row menu.
document.addEventListener("click", (event) => {
  for (const menu of /** @type {NodeListOf<HTMLDetailsElement>} */ (document.querySelectorAll(".row-menu[open]"))) {
    if (!menu.contains(/** @type {Node} */ (event.target))) menu.open = false;
  }
});

// The first tags as chips, the rest counted ("+4", their names in its title): one line a row.
function tagChips(tags) {
  if (!tags.length) return null;
  const rest = tags.slice(SHOWN_TAGS);
  return el("div", { class: "tags" }, [
    ...tags.slice(0, SHOWN_TAGS).map((t) => el("span", { class: "badge tag", text: t, title: t })),
    rest.length ? el("span", { class: "badge tag more-tags", text: `+${rest.length}`, title: rest.join(", ") }) : null,
  ]);
}

// The run's open alerts (docs/alerts.md) as one badge, their rules and subjects in its title; it
// leads to the run page's banner.
function alertBadge(run) {
  const open = run.open_alerts ?? [];
  if (!open.length) return null;
  const title = open.map((a) => (a.subject ? `${a.rule} (${a.subject})` : a.rule)).join(", ");
  const text = `⚠ ${open.length} alert${open.length === 1 ? "" : "s"}`;
  return el("a", { class: "badge alerting", href: `${api.runPageUrl(run.run_id)}#alerts-banner`, title, text });
}

function row(run) {
  const totals = api.shownTotals(run, catalogue);
  const cell = (text, cls = "num") => el("td", { class: cls, text });
  const nameCell = el("td", { class: "name-cell" }, [
    el("div", { class: "run-title" }, [
      el("a", { href: api.runPageUrl(run.run_id), text: displayName(run), title: displayName(run) }),
      actionButton("✎", `rename ${run.run_id}`, () => startRename(run, nameCell)),
    ]),
    // One line under the name: the tags, then the id (led, where the window is narrow, by the
    // project and layout, whose columns are then hidden).
    el("div", { class: "run-line muted small" }, [
      tagChips(run.tags),
      el("span", { class: "run-id", title: run.run_id }, [
        el("span", { class: "narrow-only", text: `${run.layout} · ${run.project ? `${run.project} · ` : ""}` }),
        run.run_id,
      ]),
    ]),
    run.notes ? el("div", { class: "notes muted small", title: run.notes, text: run.notes }) : null,
  ]);
  return el("tr", { "data-run-id": run.run_id, class: run.archived ? "archived" : null }, [
    el("td", { class: "check" }, checkbox(run.run_id)),
    nameCell,
    cell(run.project || "—", "col-project"),
    cell(run.layout, "col-layout"),
    el("td", { class: "status-cell" }, [
      ...statusCell(run),
      alertBadge(run),
      run.archived ? el("span", { class: "badge", text: "archived" }) : null,
    ]),
    cell(count(run.last_step)),
    ...metrics.map((metric, i) => cell(display(metric, totals[metric.name]), metricHeads[i].className)),
    el("td", { class: "row-actions" }, actionsMenu(run, [
      ["Edit tags and notes", `edit tags and notes of ${run.run_id}`, () => editDetails(run)],
      [run.archived ? "Unarchive" : "Archive", `${run.archived ? "unarchive" : "archive"} ${run.run_id}`, () => save("PATCH", run, { archived: !run.archived })],
      ["Delete", `delete ${run.run_id}`, () => confirmDelete(run)],
    ])),
  ]);
}

function filtered() {
  return view.alerts || FILTERS.some((key) => view[key]);
}

function render({ runs, total }) {
  updateCompareButton();
  document.getElementById("run-count").textContent = `${count(total)} run${total === 1 ? "" : "s"}`;
  const pages = Math.max(1, Math.ceil(total / PAGE_SIZE));
  document.getElementById("page-of").textContent = `page ${Math.floor(view.offset / PAGE_SIZE) + 1} of ${pages}`;
  /** @type {HTMLButtonElement} */ (document.getElementById("prev")).disabled = view.offset === 0;
  /** @type {HTMLButtonElement} */ (document.getElementById("next")).disabled = view.offset + PAGE_SIZE >= total;
  renderSortHeads();
  for (const run of runs) for (const key of flatKeys(run.config)) configKeys.add(key);
  fillGroupKeys();
  if (!runs.length) {
    const hint = filtered()
      ? "No runs match these filters."
      : "No runs yet. Runs appear here as soon as a trainer with the packscope agent starts.";
    body.replaceChildren(el("tr", { class: "placeholder" }, el("td", { colspan: columnCount(), text: hint })));
    return;
  }
  if (!view.group) return body.replaceChildren(...runs.map(row));
  body.replaceChildren(...groupsOf(runs, view.group).flatMap((group) => [groupRow(group, runs.length), ...group.runs.map(row)]));
}

// A group's header row: what its runs share, how many they are, and per metric column the mean of
// their values with the min–max under it.
function groupRow(group, shownRuns) {
  const leading = columnCount() - metrics.length - 1; // the columns before the metrics
  // The label spans the check and name columns; the other leading columns keep a cell each, so a
  // column hidden at small widths (col-project, col-layout) is hidden here too.
  const spacers = [...headRow.children].slice(2, leading).map((th) => el("td", { class: [...th.classList].filter((c) => c.startsWith("col-")).join(" ") || null }));
  const label = el("td", { colspan: 2, class: "group-label" }, [
    el("strong", { text: `${keyLabel(view.group)} = ${group.label}` }),
    el("span", { class: "muted small", text: ` · ${count(group.runs.length)} of the ${count(shownRuns)} runs shown` }),
  ]);
  const cells = metrics.map((metric, i) => {
    const values = group.runs.map((run) => api.shownTotals(run, catalogue)[metric.name]);
    const s = spread(values);
    const range = s && s.n > 1 ? el("div", { class: "muted small group-range", text: `${display(metric, s.min)} – ${display(metric, s.max)}` }) : null;
    return el("td", { class: metricHeads[i].className, title: s ? `mean of ${s.n} runs` : null }, [
      el("div", { class: "group-mean", text: s ? display(metric, s.mean) : "—" }),
      range,
    ]);
  });
  return el("tr", { class: "group-row", "data-group": group.label }, [label, ...spacers, ...cells, el("td")]);
}

// Rebuilt only when the list changes, so an open menu is not closed by a refresh. A value from
// the URL that no run carries (any more) stays offered, with 0 runs, so the view reads true.
function fillMenu(select, facets, current) {
  const entries = facets.map((f) => [f.value, f.runs]);
  if (current && !facets.some((f) => f.value === current)) entries.push([current, 0]);
  const options = [["", "any"], ...entries.map(([value, runs]) => [value, `${value} (${count(runs)})`])];
  const key = options.map((o) => o.join("\t")).join("\n");
  if (select.dataset.options !== key) {
    select.dataset.options = key;
    select.replaceChildren(...options.map(([value, text]) => el("option", { value, text })));
  }
  select.value = current;
}

async function refreshMenus() {
  const facets = await api.getFacets(view.archived);
  fillMenu(document.getElementById("filter-project"), facets.projects, view.project);
  fillMenu(document.getElementById("filter-tag"), facets.tags, view.tag);
}

async function refresh() {
  if (editing) return;
  const mine = ++generation;
  try {
    const params = {
      sort: view.sort,
      limit: PAGE_SIZE,
      offset: view.offset,
      archived: view.archived ? "true" : null,
      alerts: view.alerts ? "open" : null,
    };
    for (const key of FILTERS) params[key] = view[key];
    if (isConfigKey(view.group)) params.config_keys = configKeyOf(view.group);
    const [page] = await Promise.all([listRuns(params), refreshMenus()]);
    if (mine !== generation || editing) return;
    if (!page.runs.length && view.offset && page.total) {
      // The page emptied (runs deleted or filtered away): show the last one that has runs.
      view.offset = Math.max(0, Math.floor((page.total - 1) / PAGE_SIZE) * PAGE_SIZE);
      writeView();
      return refresh();
    }
    lastPage = page;
    render(page);
    report("load", null);
    document.getElementById("refreshed").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    if (mine === generation) report("load", error);
  }
}

function reload() {
  writeView();
  refresh();
}

// -- sorting, filters, pages ----------------------------------------------------------------------
let sortHeads = [];
const sortKey = (th) => th.dataset.sort || th.dataset.metric;

function renderSortHeads() {
  const key = view.sort.replace(/^-/, "");
  const descending = view.sort.startsWith("-");
  for (const th of sortHeads) {
    const active = sortKey(th) === key;
    th.setAttribute("aria-sort", active ? (descending ? "descending" : "ascending") : "none");
    th.querySelector(".sort").textContent = active ? (descending ? "▼" : "▲") : "↕";
  }
}

function setupSorting() {
  sortHeads = [...document.querySelectorAll("#runs-table th[data-sort], #runs-table th[data-metric]")];
  for (const th of sortHeads) {
    if (th.classList.contains("sortable")) continue; // set up already
    const button = el("button", { type: "button", class: "sort link-button", "aria-label": `sort by ${sortKey(th)}` });
    th.append(" ", button);
    th.classList.add("sortable");
    th.addEventListener("click", (event) => {
      if (/** @type {Element} */ (event.target).closest("a")) return; // the label's link to its definition
      const key = sortKey(th);
      const current = view.sort.replace(/^-/, "");
      // A new column starts with the useful end first: numbers high to low, text A to Z.
      if (current === key) view.sort = view.sort.startsWith("-") ? key : `-${key}`;
      else view.sort = th.classList.contains("num") ? `-${key}` : key;
      view.offset = 0;
      reload();
    });
  }
  renderSortHeads();
}

function setupFilters() {
  let timer = null;
  const inputs = FILTERS.map((key) => /** @type {HTMLInputElement | HTMLSelectElement} */ (document.getElementById(`filter-${key}`)));
  // Every filter is read at once, so a debounced field never drops another field's change.
  const apply = () => {
    clearTimeout(timer);
    let changed = false;
    FILTERS.forEach((key, i) => {
      const value = inputs[i].value.trim();
      if (value !== view[key]) [view[key], changed] = [value, true];
    });
    if (!changed) return;
    view.offset = 0;
    reload();
  };
  FILTERS.forEach((key, i) => {
    const input = inputs[i];
    input.value = view[key];
    if (input.tagName === "SELECT") input.addEventListener("change", apply);
    else
      input.addEventListener("input", () => {
        clearTimeout(timer);
        timer = setTimeout(apply, SEARCH_DEBOUNCE_MS);
      });
  });
  const archived = /** @type {HTMLInputElement} */ (document.getElementById("filter-archived"));
  archived.checked = view.archived;
  archived.addEventListener("change", () => {
    view.archived = archived.checked;
    view.offset = 0;
    reload();
  });
  const alerting = /** @type {HTMLInputElement} */ (document.getElementById("filter-alerts"));
  alerting.checked = view.alerts;
  alerting.addEventListener("change", () => {
    view.alerts = alerting.checked;
    view.offset = 0;
    reload();
  });
  document.getElementById("filters").addEventListener("submit", (event) => event.preventDefault());
  document.getElementById("prev").addEventListener("click", () => {
    view.offset = Math.max(0, view.offset - PAGE_SIZE);
    reload();
  });
  document.getElementById("next").addEventListener("click", () => {
    view.offset += PAGE_SIZE;
    reload();
  });
}

// -- columns and groups ---------------------------------------------------------------------------
const shownColumns = () => (view.cols ?? DEFAULT_COLUMNS).filter((name) => catalogue.has(name));

// The metric heads of the chosen columns, in place of the template's (before the actions column).
function buildHeads() {
  for (const th of headRow.querySelectorAll("th[data-metric]")) th.remove();
  metrics = shownColumns().map((name) => metricOf(catalogue, name));
  const actions = headRow.lastElementChild;
  metricHeads = metrics.map((metric) => {
    const th = el("th", { class: metric.name === HEADLINE ? "num headline" : "num", "data-metric": metric.name }, metricLabel(metric));
    headRow.insertBefore(th, actions);
    return th;
  });
  renderDefinitions(catalogue, metrics.map((metric) => metric.name));
  setupSorting();
}

// Every catalogue metric, the shown ones checked; a change redraws the table from the last answer.
function setupColumnChooser() {
  const box = document.getElementById("column-options");
  const chosen = new Set(shownColumns());
  const options = [...catalogue.values()].map((metric) =>
    el("label", { class: "inline" }, [
      el("input", { type: "checkbox", value: metric.name, checked: chosen.has(metric.name), "aria-label": `column ${metric.label}` }),
      ` ${metric.label}`,
    ]),
  );
  box.replaceChildren(...options);
  box.addEventListener("change", () => {
    const picked = new Set([.../** @type {NodeListOf<HTMLInputElement>} */ (box.querySelectorAll("input:checked"))].map((input) => input.value));
    // The order: the current columns that stay, then the new ones in catalogue order.
    const order = [...shownColumns().filter((name) => picked.has(name)), ...[...catalogue.keys()].filter((name) => picked.has(name) && !shownColumns().includes(name))];
    view.cols = order.join() === DEFAULT_COLUMNS.join() ? null : order;
    applyColumns();
  });
  document.getElementById("columns-default").addEventListener("click", () => {
    view.cols = null;
    for (const input of box.querySelectorAll("input")) input.checked = DEFAULT_COLUMNS.includes(input.value);
    applyColumns();
  });
}

function applyColumns() {
  writeView();
  buildHeads();
  if (lastPage) render(lastPage);
}

function fillGroupKeys() {
  const options = [...BUILT_IN_KEYS, ...[...configKeys].sort()];
  const list = document.getElementById("group-keys");
  if (list.children.length === options.length) return;
  list.replaceChildren(...options.map((value) => el("option", { value })));
}

// "project", "layout", "status", "tag", or a config key (typed as "optimizer.lr" or "config:optimizer.lr").
function setupGrouping() {
  const input = /** @type {HTMLInputElement} */ (document.getElementById("group-by"));
  input.value = keyLabel(view.group);
  input.addEventListener("change", () => {
    const text = input.value.trim();
    view.group = !text ? "" : BUILT_IN_KEYS.includes(text) || isConfigKey(text) ? text : `config:${text}`;
    writeView();
    refresh();
  });
}

async function start() {
  try {
    catalogue = await loadCatalogue();
    buildHeads();
  } catch (error) {
    return report("load", error);
  }
  setupColumnChooser();
  setupGrouping();
  fillMenu(document.getElementById("filter-project"), [], view.project); // the URL's choice, before the menus load
  fillMenu(document.getElementById("filter-tag"), [], view.tag);
  setupFilters();
  refresh();
  // A hidden tab does not need fresh numbers; it catches up when shown again.
  setInterval(() => document.hidden || refresh(), REFRESH_MS);
  document.addEventListener("visibilitychange", () => document.hidden || refresh());
}

start();
