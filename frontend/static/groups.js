// @ts-check
// Runs grouped by what they were: a config key ("config:optimizer.lr"), a tag, the project, the
// layout or the status. The runs table shows each group's mean and min–max of every column; the
// compare page draws each group's mean line with its min–max band. A run with several tags is in
// each of their groups.

// The fields of a run (GET /api/v1/runs) that grouping reads.
/**
 * @typedef {{ config?: unknown, config_values?: Record<string, unknown>, tags?: string[],
 *   [field: string]: unknown }} Run
 * @typedef {{ step: number[], first_step: number[], last_step: number[], [column: string]: (number | null)[] }} Columns
 */

export const BUILT_IN_KEYS = ["project", "layout", "status", "tag"];
const CONFIG = "config:";

export const isConfigKey = (/** @type {string} */ key) => key.startsWith(CONFIG);
export const configKeyOf = (/** @type {string} */ key) => key.slice(CONFIG.length);
export const keyLabel = (/** @type {string} */ key) => (isConfigKey(key) ? configKeyOf(key) : key);

// The dotted keys of a run's config whose values are not objects: what a run can be grouped by.
/**
 * @param {unknown} config
 * @returns {string[]}
 */
export function flatKeys(config, prefix = "") {
  if (!config || typeof config !== "object" || Array.isArray(config)) return prefix ? [prefix] : [];
  return Object.keys(config)
    .sort()
    .flatMap((key) => flatKeys(/** @type {Record<string, unknown>} */ (config)[key], prefix ? `${prefix}.${key}` : key));
}

// A config value of a run: from config_values (GET /api/v1/runs?config_keys=...), else its config.
/**
 * @param {Run} run
 * @param {string} dotted
 * @returns {unknown}
 */
export function configValue(run, dotted) {
  if (run.config_values && dotted in run.config_values) return run.config_values[dotted];
  let value = run.config;
  for (const part of dotted.split(".")) {
    if (!value || typeof value !== "object" || !(part in value)) return undefined;
    value = /** @type {Record<string, unknown>} */ (value)[part];
  }
  return value;
}

const shown = (/** @type {unknown} */ value) => (value === undefined ? "(not set)" : typeof value === "string" ? value : JSON.stringify(value));

// The group labels a run belongs to under `key`.
/**
 * @param {Run} run
 * @param {string} key
 * @returns {string[]}
 */
export function groupLabels(run, key) {
  if (key === "tag") return run.tags?.length ? run.tags : ["(no tag)"];
  if (isConfigKey(key)) return [shown(configValue(run, configKeyOf(key)))];
  return [shown(run[key] ?? undefined)];
}

// [{ label, runs, indexes }] in the order the groups first appear; indexes point into `runs`.
/**
 * @template {Run} R
 * @param {R[]} runs
 * @param {string} key
 */
export function groupsOf(runs, key) {
  /** @type {Map<string, { label: string, runs: R[], indexes: number[] }>} */
  const groups = new Map();
  runs.forEach((run, i) => {
    for (const label of groupLabels(run, key)) {
      const group = groups.get(label) ?? { label, runs: [], indexes: [] };
      groups.set(label, group);
      group.runs.push(run);
      group.indexes.push(i);
    }
  });
  return [...groups.values()];
}

// Mean, min and max of the values that are numbers; null when there is none.
/** @param {unknown[]} values */
export function spread(values) {
  const numbers = /** @type {number[]} */ (values.filter((v) => typeof v === "number" && Number.isFinite(v)));
  if (!numbers.length) return null;
  const sum = numbers.reduce((a, b) => a + b, 0);
  return { mean: sum / numbers.length, min: Math.min(...numbers), max: Math.max(...numbers), n: numbers.length };
}

// The series of a group on a common step axis: at each step that any run of the group reached,
// the mean, min and max over the runs whose point covers that step (first_step..last_step).
/**
 * @param {{ columns: Columns }[]} seriesList
 * @param {string} column
 */
export function groupSeries(seriesList, column) {
  const steps = [...new Set(seriesList.flatMap((s) => s.columns.step))].sort((a, b) => a - b);
  const cursors = seriesList.map(() => 0);
  /** @type {{ step: number[], mean: (number | null)[], min: (number | null)[], max: (number | null)[], runs: number[] }} */
  const out = { step: steps, mean: [], min: [], max: [], runs: [] };
  for (const step of steps) {
    /** @type {(number | null | undefined)[]} */
    const values = [];
    seriesList.forEach((series, k) => {
      const { first_step: firsts, last_step: lasts } = series.columns;
      while (cursors[k] < lasts.length && lasts[cursors[k]] < step) cursors[k]++;
      const i = cursors[k];
      if (i < lasts.length && firsts[i] <= step) values.push(series.columns[column]?.[i]);
    });
    const s = spread(values);
    out.mean.push(s?.mean ?? null);
    out.min.push(s?.min ?? null);
    out.max.push(s?.max ?? null);
    out.runs.push(s?.n ?? 0);
  }
  return out;
}
