// timeaxis.js: wall-clock labels in local time, h:mm:ss durations and their ticks.
import assert from "node:assert/strict";
import { test } from "node:test";

import { durationTicks, hms, localTime } from "../../frontend/static/timeaxis.js";

test("localTime writes the local wall clock, not UTC", () => {
  const zone = process.env.TZ;
  process.env.TZ = "Asia/Kolkata"; // UTC+5:30, no daylight saving
  try {
    assert.equal(localTime(0), "1970-01-01 05:30:00.000");
    assert.equal(localTime(86400 + 61.25), "1970-01-02 05:31:01.250");
  } finally {
    if (zone === undefined) delete process.env.TZ;
    else process.env.TZ = zone;
  }
});

test("hms counts hours past a day and rounds to whole seconds", () => {
  assert.equal(hms(3725), "1:02:05");
  assert.equal(hms(7 * 86400), "168:00:00");
  assert.equal(hms(59.6), "0:01:00");
  assert.equal(hms(-61), "−0:01:01");
});

test("durationTicks picks the first step giving at most six ticks", () => {
  assert.deepEqual(durationTicks(0, 3600), {
    tickvals: [0, 600, 1200, 1800, 2400, 3000, 3600],
    ticktext: ["0:00:00", "0:10:00", "0:20:00", "0:30:00", "0:40:00", "0:50:00", "1:00:00"],
  });
  // 35 s wide: 5 s steps would give 7, so 10 s, starting at the first multiple in range
  assert.deepEqual(durationTicks(5, 40), { tickvals: [10, 20, 30, 40], ticktext: ["0:00:10", "0:00:20", "0:00:30", "0:00:40"] });
});

test("past a day the step is whole days", () => {
  const { tickvals, ticktext } = durationTicks(0, 30 * 86400);
  assert.deepEqual(tickvals, [0, 1, 2, 3, 4, 5, 6].map((k) => k * 5 * 86400));
  assert.equal(ticktext[1], "120:00:00");
});

test("an empty or invalid range has no ticks", () => {
  const none = { tickvals: [], ticktext: [] };
  assert.deepEqual(durationTicks(10, 5), none);
  assert.deepEqual(durationTicks(NaN, 5), none);
  assert.deepEqual(durationTicks(0, Infinity), none);
});
