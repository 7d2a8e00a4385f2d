// @ts-check
// What a run summary says beside its numbers, said the same way on every page: whether its agent
// is still heard from (stale, crashed: the server's status from the missing heartbeats), the
// steps each number covers, which pack size the baseline counted, and intervals that were refused.

import { metricOf } from "./catalogue.js";
import { el } from "./dom.js";
import { count, formatNumber } from "./format.js";

// The statuses in which a run may still send: its page keeps listening.
export const LIVE = new Set(["running", "stale", "crashed"]);

const clock = (iso) => new Date(iso).toLocaleTimeString();
const day = (iso) => new Date(iso).toLocaleDateString();

// "12:03:04 (4 min ago)", with the date when it is not today.
export function contactText(iso, now = Date.now()) {
  if (!iso) return "";
  const today = new Date(now).toDateString() === new Date(iso).toDateString();
  return `${today ? "" : `${day(iso)} `}${clock(iso)} (${ago(iso, now)})`;
}

const STATUS_TITLE = {
  running: "its agent is sending",
  stale: "its agent has missed 3 heartbeats: it may be stuck or gone",
  crashed: "its agent has been silent for 10 heartbeats: the process is most likely gone",
  finished: "its agent closed it",
  failed: "its agent marked it failed (an exception or SIGTERM)",
};

// "4 min ago"
function ago(iso, now = Date.now()) {
  const seconds = Math.max(0, (now - Date.parse(iso)) / 1000);
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  return `${formatNumber(".2g", seconds / 3600)} h ago`;
}

// The status badge, and for a silent run when it was last heard of (the full time on hover).
export function statusCell(run) {
  const badge = el("span", { class: `badge status-${run.status}`, text: run.status, title: STATUS_TITLE[run.status] });
  const silent = run.status === "stale" || run.status === "crashed";
  const heard = silent
    ? el("div", { class: "muted small contact", title: `last contact ${contactText(run.last_contact_at)}`, text: `heard ${ago(run.last_contact_at)}` })
    : null;
  const refused = run.refused ? el("span", { class: "badge status-refused", title: refusalText(run), text: `${count(run.refused.intervals)} refused` }) : null;
  return [badge, refused, heard];
}

const span = (first, last) => (first === last ? `step ${count(first)}` : `steps ${count(first)}–${count(last)}`);

// The steps a run's shown numbers cover: rates leave the first interval out once there is a second
// (api.shownTotals), amounts count them all.
export function windows(run) {
  if (run.first_step == null || run.last_step == null) return null;
  const all = span(run.first_step, run.last_step);
  if (run.steady_first_step == null) return { rates: all, amounts: all, warmup: null };
  return { rates: span(run.steady_first_step, run.last_step), amounts: all, warmup: span(run.first_step, run.steady_first_step - 1) };
}

// One line: the steps the rates and the amounts cover.
export function windowsNote(run, where = "here") {
  const w = windows(run);
  if (!w) return "";
  if (!w.warmup) return `Every number ${where} covers ${w.amounts} (the run has one interval so far).`;
  return `Rates ${where} cover ${w.rates}: the first interval (${w.warmup}: allocation, compilation, graph capture) is left out. Amounts (steps, tokens, FLOPs) cover ${w.amounts}.`;
}

// Which pack the baseline counted as one dense sequence.
export function baselineText(run) {
  if (run.pack_length) {
    const from = run.pack_length_from ? ` (${run.pack_length_from})` : "";
    return `Baseline: each pack counted as one dense sequence of ${count(run.pack_length)} tokens${from}; a longer row the model ran counts as that many packs of it.`;
  }
  const totals = run.totals;
  if (!totals?.packs) return "Baseline: each row the model runs counted as one dense sequence.";
  const mean = totals.tokens / totals.packs;
  return `Baseline: each row the model ran counted as one dense sequence (on average ${count(mean)} token slots a row).`;
}

// What the cross-document check found (agent/integrations/cross_documents.py): { warn, text }, or
// null when no check was reported. "crossed" is a training bug of the user's, said plainly.
export function crossDocumentsText(run) {
  const found = run.cross_documents;
  if (!found) return null;
  const detail = run.cross_documents_detail ? ` (${run.cross_documents_detail})` : "";
  if (found === "crossed") {
    return {
      warn: true,
      text: `Packed documents attend to each other: the model trains across document boundaries${detail}. Give it per-document masks (another batch form or attention implementation); meanwhile the per-document FLOPs count its whole-row attention, the work it did.`,
    };
  }
  if (found === "kept") return { warn: false, text: `Packed documents stay apart: checked on a small copy of the model${detail}.` };
  return { warn: false, text: `Whether packed documents stay apart was not checked${detail}.` };
}

// "12 intervals refused (steps 1–120): why" — the most frequent reasons first.
export function refusalText(run) {
  const r = run.refused;
  if (!r) return "";
  const who = { agent: "the agent", server: "the server" };
  const reasons = r.reasons.map((x) => `${x.reason} (${count(x.intervals)} by ${who[x.by]})`).join("; ");
  return `${count(r.intervals)} interval${r.intervals === 1 ? "" : "s"} refused (${span(r.first_step, r.last_step)}): ${reasons}`;
}

// What an empty chart says: still waiting, or why nothing will come.
export function emptyText(run) {
  if (run?.refused && !run.records) return `No interval stored: ${refusalText(run)}.`;
  if (run && !run.records && !LIVE.has(run.status)) return `This run ${run.status === "failed" ? "failed" : "ended"} without storing an interval.`;
  if (run && !run.records && run.status !== "running") return "No interval stored, and its agent has gone silent.";
  return "Waiting for the first interval…";
}

// The catalogue's per-kind shares of attention (their labels are the catalogue's too).
const ATTENTION_KINDS = ["attention_full_pct", "attention_sliding_pct", "attention_chunked_pct"];
const percent = (x) => `${formatNumber(".1f", x)}%`;

// Where the per-document FLOPs go: attention's share, split by layer kind where the model has
// more than full attention, and the vision and audio towers' shares where it has them.
export function flopsSplitText(shown, catalogue) {
  const share = shown.attention_share_pct;
  if (share === null || share === undefined) return "";
  const kinds = ATTENTION_KINDS.filter((name) => shown[name] > 0);
  const onlyFull = kinds.length === 1 && kinds[0] === "attention_full_pct";
  const part = (name) => `${metricOf(catalogue, name).label} ${percent(shown[name])}`;
  const split = kinds.length && !onlyFull ? ` (${kinds.map(part).join(", ")})` : "";
  const towers = ["vision_share_pct", "audio_share_pct"].filter((name) => shown[name] > 0);
  const tower = towers.map((name) => `; ${part(name)}`).join("");
  return `Of the per-document FLOPs, attention is ${percent(share)}${split}${tower}.`;
}
