// groups.js: grouping runs by a config key, a tag or a field, and a group's series.
import assert from "node:assert/strict";
import { test } from "node:test";

import { configValue, flatKeys, groupLabels, groupSeries, groupsOf, keyLabel, spread } from "../../frontend/static/groups.js";

test("flatKeys lists the dotted leaves of a config, sorted", () => {
  const config = { seed: 1, optimizer: { name: "adam", lr: 1e-3 }, tags: [1, 2] };
  assert.deepEqual(flatKeys(config), ["optimizer.lr", "optimizer.name", "seed", "tags"]);
  assert.deepEqual(flatKeys(null), []);
  assert.deepEqual(flatKeys(5), []);
});

test("configValue prefers config_values and walks the config otherwise", () => {
  const run = { config: { optimizer: { lr: 0.1 } } };
  assert.equal(configValue(run, "optimizer.lr"), 0.1);
  assert.equal(configValue(run, "optimizer.beta"), undefined);
  assert.equal(configValue(run, "seed.value"), undefined);
  assert.equal(configValue({ ...run, config_values: { "optimizer.lr": 0.5 } }, "optimizer.lr"), 0.5);
});

test("groupLabels: every tag, a config value as text, a field", () => {
  assert.deepEqual(groupLabels({ tags: ["a", "b"] }, "tag"), ["a", "b"]);
  assert.deepEqual(groupLabels({ tags: [] }, "tag"), ["(no tag)"]);
  assert.deepEqual(groupLabels({ config: { lr: 0.1 } }, "config:lr"), ["0.1"]);
  assert.deepEqual(groupLabels({ config: { opt: "adam" } }, "config:opt"), ["adam"]);
  assert.deepEqual(groupLabels({ config: {} }, "config:lr"), ["(not set)"]);
  assert.deepEqual(groupLabels({ project: "p" }, "project"), ["p"]);
  assert.deepEqual(groupLabels({ project: null }, "project"), ["(not set)"]);
  assert.equal(keyLabel("config:optimizer.lr"), "optimizer.lr");
  assert.equal(keyLabel("status"), "status");
});

test("groupsOf keeps first-seen order and puts a run with two tags in both groups", () => {
  const runs = [{ tags: ["a"] }, { tags: ["b", "a"] }, { tags: [] }];
  const groups = groupsOf(runs, "tag");
  assert.deepEqual(
    groups.map(({ label, indexes }) => [label, indexes]),
    [
      ["a", [0, 1]],
      ["b", [1]],
      ["(no tag)", [2]],
    ],
  );
  assert.equal(groups[1].runs[0], runs[1]);
});

test("spread counts only finite numbers", () => {
  assert.deepEqual(spread([1, "x", null, 3, NaN, 5, undefined]), { mean: 3, min: 1, max: 5, n: 3 });
  assert.equal(spread([null, "2"]), null);
});

test("groupSeries takes, at each step, the runs whose point covers it", () => {
  const a = { columns: { step: [10, 20], first_step: [1, 11], last_step: [10, 20], loss: [4, 2] } };
  const b = { columns: { step: [15, 30], first_step: [1, 16], last_step: [15, 30], loss: [6, null] } };
  // step 10: a 4, b 6 · 15: a's second point (11–20) 2, b 6 · 20: a 2, b's null · 30: a has ended
  assert.deepEqual(groupSeries([a, b], "loss"), {
    step: [10, 15, 20, 30],
    mean: [5, 4, 2, null],
    min: [4, 2, 2, null],
    max: [6, 6, 2, null],
    runs: [2, 2, 1, 0],
  });
});
