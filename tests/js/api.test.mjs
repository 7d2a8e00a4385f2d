// fetchJSON waits out a busy server's 503 as Retry-After says, a few times, then gives up.
import assert from "node:assert/strict";
import { test } from "node:test";

import { BUSY_RETRIES, fetchJSON } from "../../frontend/static/api.js";

function stubFetch(statuses) {
  const calls = [];
  globalThis.fetch = async (url) => {
    calls.push(url);
    const status = statuses[Math.min(calls.length - 1, statuses.length - 1)];
    return new Response(status === 200 ? JSON.stringify({ ok: true }) : "busy", {
      status,
      headers: status === 503 ? { "Retry-After": "0" } : {},
    });
  };
  return calls;
}

test("a read answered 503 is asked again after Retry-After and its answer returned", async () => {
  const calls = stubFetch([503, 503, 200]);
  assert.deepEqual(await fetchJSON("/runs"), { ok: true });
  assert.equal(calls.length, 3);
});

test("a server still busy after the retries surfaces its 503", async () => {
  const calls = stubFetch([503]);
  await assert.rejects(fetchJSON("/runs"), (error) => error.status === 503);
  assert.equal(calls.length, BUSY_RETRIES + 1);
});

test("other errors are not retried", async () => {
  const calls = stubFetch([404]);
  await assert.rejects(fetchJSON("/runs/x"), (error) => error.status === 404);
  assert.equal(calls.length, 1);
});
