// run_facts.js: where the per-document FLOPs go, the towers' shares shown only where a model has them.
import assert from "node:assert/strict";
import { test } from "node:test";

import { flopsSplitText } from "../../frontend/static/run_facts.js";

const catalogue = new Map(
  ["attention_full_pct", "attention_sliding_pct", "attention_chunked_pct", "vision_share_pct", "audio_share_pct"].map(
    (name) => [name, { name, label: name.replace(/_(share_)?pct$/, "").replace("_", " ") }],
  ),
);
const shown = (extra) => ({ attention_share_pct: 20, attention_full_pct: 20, ...extra });

test("an omni model's audio tower share follows the vision tower's", () => {
  assert.equal(
    flopsSplitText(shown({ vision_share_pct: 5, audio_share_pct: 12.5 }), catalogue),
    "Of the per-document FLOPs, attention is 20.0%; vision 5.0%; audio 12.5%.",
  );
  assert.equal(
    flopsSplitText(shown({ vision_share_pct: 0, audio_share_pct: 3 }), catalogue),
    "Of the per-document FLOPs, attention is 20.0%; audio 3.0%.",
  );
});

test("a model without towers says attention alone", () => {
  assert.equal(flopsSplitText(shown({ vision_share_pct: 0, audio_share_pct: 0 }), catalogue), "Of the per-document FLOPs, attention is 20.0%.");
  assert.equal(flopsSplitText(shown({}), catalogue), "Of the per-document FLOPs, attention is 20.0%.");
});
