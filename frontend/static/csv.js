// @ts-check
// CSV built in the browser from exactly what a chart plotted.

/** @typedef {{ x?: unknown[], y: unknown[], name?: string, meta?: { kind?: string, csv?: string } }} Trace */

// A text cell a spreadsheet would run as a formula (=, +, -, @, a tab or a carriage return
// first: a run named "=HYPERLINK(...)") is written with a leading ' so that it stays text.
/** @param {unknown} value */
function cell(value) {
  if (value === null || value === undefined) return "";
  let text = String(value);
  if (typeof value === "string" && /^[=+\-@\t\r]/.test(text)) text = `'${text}`;
  return /[",\n]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
}

/**
 * @param {unknown[]} header
 * @param {unknown[][]} rows
 */
function toCSV(header, rows) {
  return [header, ...rows].map((row) => row.map(cell).join(",")).join("\n") + "\n";
}

// Joins the traces on x, so traces with different x (compare overlays) still line up;
// the plotted values come first, their min–max bands after.
/**
 * @param {Trace[]} plotted
 * @param {string} xName
 */
export function tracesToCSV(plotted, xName) {
  const traces = [...plotted].sort((a, b) => Number(a.meta?.kind === "band") - Number(b.meta?.kind === "band"));
  /** @type {Map<unknown, unknown[]>} */
  const rowsByX = new Map();
  traces.forEach((trace, column) => {
    (trace.x || []).forEach((x, i) => {
      const row = rowsByX.get(x) ?? new Array(traces.length).fill(null);
      rowsByX.set(x, row);
      row[column] = trace.y[i];
    });
  });
  let xs = [...rowsByX.keys()];
  if (xs.every((x) => typeof x === "number")) xs = /** @type {number[]} */ (xs).sort((a, b) => a - b);
  const header = [xName, ...traces.map((trace) => trace.meta?.csv || trace.name)];
  return toCSV(header, xs.map((x) => [x, .../** @type {unknown[]} */ (rowsByX.get(x))]));
}

// A small "CSV" link; the data is read at click time so live-extended charts export everything.
/**
 * @param {string} filename
 * @param {() => string} buildCSV
 */
export function csvLink(filename, buildCSV) {
  const link = document.createElement("a");
  link.className = "csv-link";
  link.href = "#";
  link.textContent = "CSV";
  link.title = `Download ${filename}`;
  link.addEventListener("click", (event) => {
    event.preventDefault();
    const url = URL.createObjectURL(new Blob([buildCSV()], { type: "text/csv" }));
    const anchor = document.createElement("a");
    anchor.href = url;
    anchor.download = filename;
    anchor.click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  });
  return link;
}
