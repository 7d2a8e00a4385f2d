// channels.js: per-channel loss as series columns, appended across live updates.
import assert from "node:assert/strict";
import { test } from "node:test";

import { appendColumns, channelColumns, channelMetric, channelOf, isChannel } from "../../frontend/static/channels.js";

test("channel_loss becomes prefixed columns", () => {
  assert.deepEqual(channelColumns({ channel_loss: { code: [1, 2], web: [3, null] } }), {
    "channel_loss:code": [1, 2],
    "channel_loss:web": [3, null],
  });
  assert.deepEqual(channelColumns({}), {});
  assert.equal(isChannel("channel_loss:code"), true);
  assert.equal(isChannel("loss"), false);
  assert.equal(channelOf("channel_loss:code"), "code");
});

test("a channel's metric is the loss entry under the channel's name", () => {
  const loss = { name: "loss", label: "loss", unit: "", format: ".4f", doc: "the loss" };
  assert.deepEqual(channelMetric(loss, "channel_loss:math"), { ...loss, name: "channel_loss:math", label: "loss · math" });
});

test("appending pads a channel that one side lacks with nulls", () => {
  const held = { a: [1], c: [9] };
  appendColumns(held, 1, { a: [2, 3], b: [4, 5] }, 2);
  assert.deepEqual(held, { a: [1, 2, 3], c: [9, null, null], b: [null, 4, 5] });
});
