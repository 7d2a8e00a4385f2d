// Runs grouped by what they were: a config key ("config:optimizer.lr"), a tag, the project, the
// layout or the status. The runs table shows each group's mean and min–max of every column; the
// compare page draws each group's mean line with its min–max band. A run with several tags is in
// each of their groups.

export const BUILT_IN_KEYS = ["project", "layout", "status", "tag"];
const CONFIG = "config:";

export const isConfigKey = (key) => key.startsWith(CONFIG);
export const configKeyOf = (key) => key.slice(CONFIG.length);
export const keyLabel = (key) => (isConfigKey(key) ? configKeyOf(key) : key);

// The dotted keys of a run's config whose values are not objects: what a run can be grouped by.
export function flatKeys(config, prefix = "") {
  if (!config || typeof config !== "object" || Array.isArray(config)) return prefix ? [prefix] : [];
  return Object.keys(config)
    .sort()
    .flatMap((key) => flatKeys(config[key], prefix ? `${prefix}.${key}` : key));
}

// A config value of a run: from config_values (GET /api/v1/runs?config_keys=...), else its config.
export function configValue(run, dotted) {
  if (run.config_values && dotted in run.config_values) return run.config_values[dotted];
  let value = run.config;
  for (const part of dotted.split(".")) {
    if (!value || typeof value !== "object" || !(part in value)) return undefined;
    value = value[part];
  }
  return value;
}

const shown = (value) => (value === undefined ? "(not set)" : typeof value === "string" ? value : JSON.stringify(value));

// The group labels a run belongs to under `key`.
export function groupLabels(run, key) {
  if (key === "tag") return run.tags?.length ? run.tags : ["(no tag)"];
  if (isConfigKey(key)) return [shown(configValue(run, configKeyOf(key)))];
  return [shown(run[key] ?? undefined)];
}

// [{ label, runs, indexes }] in the order the groups first appear; indexes point into `runs`.
export function groupsOf(runs, key) {
  const groups = new Map();
  runs.forEach((run, i) => {
    for (const label of groupLabels(run, key)) {
      if (!groups.has(label)) groups.set(label, { label, runs: [], indexes: [] });
      groups.get(label).runs.push(run);
      groups.get(label).indexes.push(i);
    }
  });
  return [...groups.values()];
}

// Mean, min and max of the values that are numbers; null when there is none.
export function spread(values) {
  const numbers = values.filter((v) => typeof v === "number" && Number.isFinite(v));
  if (!numbers.length) return null;
  const sum = numbers.reduce((a, b) => a + b, 0);
  return { mean: sum / numbers.length, min: Math.min(...numbers), max: Math.max(...numbers), n: numbers.length };
}

// The series of a group on a common step axis: at each step that any run of the group reached,
// the mean, min and max over the runs whose point covers that step (first_step..last_step).
export function groupSeries(seriesList, column) {
  const steps = [...new Set(seriesList.flatMap((s) => s.columns.step))].sort((a, b) => a - b);
  const cursors = seriesList.map(() => 0);
  const out = { step: steps, mean: [], min: [], max: [], runs: [] };
  for (const step of steps) {
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
