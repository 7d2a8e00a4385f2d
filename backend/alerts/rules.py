"""The alert rules (docs/alerts.md): pure judgements of a run's intervals, each from the catalogue's
sums through its metrics, never from a number the agent computed itself.

A rule answers, per subject ("" or "rank 3" or a sync site), FIRING (the alert should be open,
with the numbers that say why), CLEAR (it should be resolved), or nothing (undecided: too few
measured intervals, or a streak that is neither). Open and resolve both need a streak of
consecutive measured intervals, so one noisy interval neither opens nor resolves an alert.

A rule judges the intervals' history, not only their latest state: a breaching streak that no
alert has reported yet (RunFacts.reported) fires even where the intervals after it already clear
it, since a slowdown may open and end between two judging rounds (a batch brings several
intervals, or the server is busy); the next round resolves the alert it opened.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from packscope.backend.reads.liveness import CRASHED_BEATS
from packscope.backend.reads.ranks import order_statistic
from packscope.core.catalogue import FLOAT_OPS, METRIC, SUM_NAMES, Coefficients, sync_counted_steps
from packscope.core.ledger import IntervalRanks, ledger_terms, rank_waits, step_time_s

RULES = ("stalled", "crashed", "slowdown", "straggler", "sync_regression", "nonfinite_loss", "mfu_floor")
# Rules whose subject is only named when the alert opens (a sync site): one such alert per run at
# most, whatever the site; the others' subjects are judged one by one.
ONE_PER_RUN = frozenset({"sync_regression"})
# The loss ledger's term each rule maps to (packscope/core/ledger.py); slowdown and mfu_floor
# name the term that grew (or the largest) at the time.
LEDGER_TERM = {"straggler": "stragglers", "sync_regression": "host_syncs"}
# Rules whose alert names what only every rank's rows tell (Interval.sites): the sync site; read
# when one of them is about to open. The ledger terms that slowdown and mfu_floor name come from
# the interval sums and the rank summaries, which every round reads.
NAMES_RANK_DETAILS = frozenset({"sync_regression"})
_DENSE_LAYOUTS = frozenset({"bshd"})  # the layouts whose baseline count is the work that ran


@dataclass(frozen=True)
class Thresholds:
    """Every rule's settings. Defaults: none fires on the gallery's runs (tests/backend/test_alerts.py)."""

    warmup_intervals: int = 1  # the first intervals (compile, capture) belong to no baseline
    baseline_intervals: int = 5  # the intervals after the warm-up whose median is the run's baseline
    stalled_gap_factor: float = 5.0  # stalled: silent for this many median interval gaps...
    stalled_floor_s: float = 120.0  # ...and at least this long
    stalled_resolve_intervals: int = 3  # intervals in a row at most the limit apart that resolve a stall
    slowdown_pct: float = 25.0  # slowdown: FLOP/s of the work that ran this much below the baseline...
    slowdown_intervals: int = 3  # ...for this many consecutive intervals (and as many to resolve)
    straggler_pct: float = 25.0  # straggler: a rank's step time this much above the other ranks' median...
    straggler_intervals: int = 3
    sync_increase_pct: float = 50.0  # sync regression: syncs/iteration above the baseline by this much...
    sync_min_increase: float = 1.0  # ...and by at least this many syncs per iteration...
    sync_intervals: int = 3  # ...for this many consecutive intervals whose syncs were counted
    nonfinite_resolve_intervals: int = 3  # finite losses in a row that resolve a non-finite one
    mfu_floor: float | None = None  # useful MFU (a fraction, 0.3 = 30%) below which mfu_floor fires; off when None
    mfu_floor_intervals: int = 3

    @classmethod
    def merged(cls, *overrides: Mapping[str, Any]) -> Thresholds:
        """The defaults with each mapping's keys applied in turn (later ones win), checked."""
        values: dict[str, Any] = {}
        for override in overrides:
            values.update(override)
        return cls.checked(values)

    @classmethod
    def checked(cls, values: Mapping[str, Any]) -> Thresholds:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown alert thresholds: {', '.join(unknown)} (known: {', '.join(known)})")
        checked: dict[str, Any] = {}
        defaults = cls()
        for name, value in values.items():
            if name == "mfu_floor" and value is None:
                checked[name] = None
                continue
            default = getattr(defaults, name)
            kind = int if isinstance(default, int) else float
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"alert threshold {name} must be a finite number, not {value!r}")
            if kind is int and value != int(value):
                raise ValueError(f"alert threshold {name} must be a whole number, not {value!r}")
            if value < (1 if kind is int and name != "warmup_intervals" else 0):
                raise ValueError(f"alert threshold {name} must be positive, not {value!r}")
            checked[name] = kind(value)
        return cls(**checked)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Interval:
    """One interval of a run: its catalogue sums over every rank, its ranks' step times as the
    rank summaries keep them (store/rank_summaries.py), whether a rank sent a non-finite loss,
    and, where an alert that names one is about to open (inputs.with_rank_details), the sync
    sites ({site: count}, over the ranks)."""

    interval: int
    wall_end: float
    sums: Mapping[str, float]
    ranks: int = 1  # the ranks that sent it
    slowest: tuple[tuple[int, float], ...] = ()  # (rank, step time) of its slowest ranks, slowest first
    mean_step_s: float | None = None  # its ranks' mean step time (the rank summary's Σ ÷ ranks)
    # (ranks, least, greatest) step time per bucket: those holding others_median_places (inputs.py
    # keeps no other), the `below_buckets` ranks under them left out
    buckets: tuple[tuple[int, float, float], ...] = ()
    below_buckets: int = 0
    sites: Mapping[str, int] = field(default_factory=dict)
    nonfinite_loss: bool = False


@dataclass(frozen=True)
class RunFacts:
    """What the rules read of the run itself."""

    shown_status: str  # reads/liveness.py's: running, stale, crashed, finished, failed
    silent_s: float  # seconds since the run's last new interval (or registration, or status)
    layout: str | None
    coefficients: Coefficients
    hosts: Mapping[int, str] = field(default_factory=dict)  # rank -> host, where the trainer registered them
    # (rule, subject) -> the latest interval the run's alerts have covered (inf while one is open;
    # a resolved one covers up to the latest interval judged when it resolved); missing: none yet.
    # A ONE_PER_RUN rule's alerts are all under subject "" (inputs.reported_through).
    reported: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def reported_through(self, rule: str, subject: str = "") -> float | None:
        return self.reported.get((rule, subject))


@dataclass(frozen=True)
class Firing:
    summary: str
    details: dict[str, Any]
    ledger_term: str | None = None
    subject: str = ""  # for the ONE_PER_RUN rules: the subject named if the alert opens now


CLEAR = "clear"
Verdict = Firing | str  # a Firing, or CLEAR
Verdicts = dict[str, Verdict]  # subject -> verdict; a subject left out is undecided


def _metric(name: str, sums: Mapping[str, float], c: Coefficients) -> float | None:
    value = METRIC[name].formula(sums, c, FLOAT_OPS)
    return value if math.isfinite(value) else None


def work_metric(layout: str | None) -> str:
    """The FLOP/s of the work that ran: the baseline count on a padded layout (every row ran dense),
    the per-document count on a packed one. Normalised by each interval's exact FLOPs, a change of
    the documents' length mix alone leaves it where it was."""
    return "tflops_bshd" if layout in _DENSE_LAYOUTS else "tflops_thd"


def streak(breaches: Sequence[bool | None], open_n: int, resolve_n: int) -> bool | None:
    """True when the last `open_n` measured values (None: not measured, skipped) all breach, False
    when the last `resolve_n` all do not, None otherwise (too few, or mixed)."""
    measured = [b for b in breaches if b is not None]
    if len(measured) >= open_n and all(measured[-open_n:]):
        return True
    if len(measured) >= resolve_n and not any(measured[-resolve_n:]):
        return False
    return None


def _latest_breach_streak(measured: Sequence[tuple[int, bool]], n: int) -> list[int]:
    """The intervals of the latest run of at least `n` consecutive breaches in `measured`
    ((interval, breach) in order), or []."""
    run: list[int] = []
    for index, breach in reversed(measured):
        if breach:
            run.append(index)
        elif len(run) >= n:
            break
        else:
            run = []
    return sorted(run) if len(run) >= n else []


def judged_streak(
    indexed: Sequence[tuple[int, bool | None]], open_n: int, resolve_n: int, reported: float | None
) -> tuple[bool | None, list[int]]:
    """streak() over (interval, breach) pairs, with the intervals that make the firing streak: the
    last `open_n` measured ones, or else the latest streak of `open_n` breaches after `reported`
    (the latest interval an alert covered), which opened, and may have ended, since the last round."""
    measured = [(i, b) for i, b in indexed if b is not None]
    state = streak([b for _, b in measured], open_n, resolve_n)
    if state:
        return True, [i for i, _ in measured[-open_n:]]
    missed = _latest_breach_streak(measured, open_n)
    if missed and (reported is None or missed[-1] > reported):
        return True, missed
    return state, []


def _window_sums(window: Sequence[Interval]) -> dict[str, float]:
    out = dict.fromkeys(SUM_NAMES, 0.0)
    for i in window:
        for name in SUM_NAMES:
            out[name] += i.sums[name]
    return out


def _rank_window(window: Sequence[Interval]) -> list[IntervalRanks]:
    """The window's intervals as the ledger's straggler term reads them (the rank summaries)."""
    return [
        IntervalRanks(i.sums["steps"], i.ranks, i.mean_step_s, i.slowest[0][1], i.slowest[0][0])
        for i in window
        if i.slowest and i.mean_step_s is not None
    ]


def _ledger_ms(window: Sequence[Interval], facts: RunFacts) -> dict[str, float]:
    """The measured loss terms of a window in ms per step."""
    sums, c = _window_sums(window), facts.coefficients
    step_s = step_time_s(sums, c)
    if step_s is None:
        return {}
    terms = ledger_terms(sums, c, facts.layout, rank_waits(_rank_window(window)), ())
    return {t.name: t.fraction * step_s * 1e3 for t in terms if t.loss and t.fraction is not None}


def grown_term(baseline: Sequence[Interval], recent: Sequence[Interval], facts: RunFacts) -> tuple[str | None, float]:
    """The measured ledger term that grew most (ms per step) from `baseline` to `recent`."""
    before, after = _ledger_ms(baseline, facts), _ledger_ms(recent, facts)
    growth = {name: after[name] - before.get(name, 0.0) for name in after}
    if not growth:
        return None, 0.0
    name = max(growth, key=lambda n: growth[n])
    return (name, growth[name]) if growth[name] > 0 else (None, 0.0)


@dataclass(frozen=True)
class Windows:
    """A run's intervals as the rules split them: the baseline (after the warm-up) and the later ones."""

    baseline: Sequence[Interval]
    later: Sequence[Interval]

    @classmethod
    def of(cls, intervals: Sequence[Interval], t: Thresholds) -> Windows:
        ordered = sorted(intervals, key=lambda i: i.interval)
        end = t.warmup_intervals + t.baseline_intervals
        return cls(ordered[t.warmup_intervals : end], ordered[end:])


# -- the rules ------------------------------------------------------------------------------------
def stalled(facts: RunFacts, intervals: Sequence[Interval], t: Thresholds) -> Verdicts:
    """No new interval for longer than the run's own cadence predicts (heartbeats do not count:
    a trainer that hangs keeps its sender thread beating). Resolving needs a streak, as every rule
    does: the latest stalled_resolve_intervals intervals each ended at most the limit after the one
    before. One interval after a silence is not a run back at its cadence; a run that limps (an
    interval now and then, each after a silence past the limit) keeps its one alert open instead
    of opening and resolving it at every interval."""
    if facts.shown_status not in ("running", "stale"):
        return {"": CLEAR}
    ordered = sorted(intervals, key=lambda i: i.interval)
    gaps = [
        (b.wall_end - a.wall_end) / (b.interval - a.interval)
        for a, b in itertools.pairwise(ordered)
        if b.wall_end > a.wall_end
    ]
    if len(gaps) < 2:
        return {}  # no cadence yet
    median_gap = statistics.median(gaps)
    limit = max(t.stalled_floor_s, t.stalled_gap_factor * median_gap)
    if facts.silent_s > limit:
        summary = f"no new interval for {facts.silent_s:.0f} s (the run sends one every {median_gap:.3g} s)"
        details = {"silent_s": facts.silent_s, "median_gap_s": median_gap, "limit_s": limit}
        return {"": Firing(summary, details)}
    n = t.stalled_resolve_intervals
    # The trainer's own clock (wall_end), so an agent's backlog sent late in one batch, whose
    # intervals ended at the run's cadence, resolves at once.
    latest = ordered[-(n + 1) :]
    steps = [b.wall_end - a.wall_end for a, b in itertools.pairwise(latest)]
    if len(steps) == n and all(step <= limit for step in steps):
        return {"": CLEAR}
    return {}  # back, but not yet for n intervals at its cadence: an open alert stays open


def crashed(facts: RunFacts, t: Thresholds) -> Verdicts:
    """The run's crashed (no contact for CRASHED_BEATS heartbeats) or failed status."""
    if facts.shown_status in ("crashed", "failed"):
        if facts.shown_status == "failed":
            summary = "run failed: marked failed by its trainer (an exception, or SIGTERM)"
        else:
            silent = f"no new interval for {facts.silent_s:.0f} s"
            summary = f"run crashed: no contact from its agent for {CRASHED_BEATS} heartbeats ({silent})"
        return {"": Firing(summary, {"status": facts.shown_status, "silent_s": facts.silent_s})}
    if facts.shown_status in ("running", "finished"):
        return {"": CLEAR}
    return {}


def slowdown(facts: RunFacts, windows: Windows, t: Thresholds) -> Verdicts:
    """The FLOP/s of the work that ran (work_metric) below the baseline's median by slowdown_pct."""
    c, name = facts.coefficients, work_metric(facts.layout)
    rates = [_metric(name, i.sums, c) for i in windows.baseline]
    known = [r for r in rates if r is not None]
    if len(known) < max(1, t.baseline_intervals // 2 + 1) or not windows.later:
        return {}
    baseline = statistics.median(known)
    floor = baseline * (1.0 - t.slowdown_pct / 100.0)
    later = [(i, _metric(name, i.sums, c)) for i in windows.later]
    breaches = [(i.interval, None if r is None else r < floor) for i, r in later]
    n = t.slowdown_intervals
    state, fired = judged_streak(breaches, n, n, facts.reported_through("slowdown"))
    if not state:
        return {} if state is None else {"": CLEAR}
    recent = [i for i, _ in later if i.interval in fired]
    rate = _metric(name, _window_sums(recent), c) or 0.0
    term, grew_ms = grown_term(windows.baseline, recent, facts)
    drop = 100.0 * (1.0 - rate / baseline)
    summary = (
        f"{drop:.0f}% slower than its baseline: {rate:.4g} TFLOP/s/GPU of the work that ran over the last "
        f"{len(recent)} intervals, against {baseline:.4g}"
    )
    details = {
        "metric": name, "baseline": baseline, "recent": rate, "drop_pct": drop, "threshold_pct": t.slowdown_pct,
        "intervals": [i.interval for i in recent], "ledger_growth_ms_per_step": grew_ms if term else None,
    }  # fmt: skip
    if term:
        summary += f"; the ledger's {term} grew {grew_ms:.3g} ms per step"
    return {"": Firing(summary, details, term)}


def _order_statistic(i: Interval, k: int) -> float:
    """The k-th smallest step time (1-based) of the interval's ranks: exact where it is one of the
    slowest ranks kept, else from the buckets (within a bucket's width, reads/ranks.py); a
    ValueError where the buckets held do not reach it."""
    from_top = i.ranks - k  # 0: the slowest
    return i.slowest[from_top][1] if from_top < len(i.slowest) else order_statistic(i.buckets, k, i.below_buckets)


def others_median_places(ranks: int) -> tuple[int, int]:
    """The first and last places (1-based, ascending) of an interval's `ranks` step times that
    _others_median reads, whichever one it leaves out: the middle one or two of the others,
    shifted up by one where the left-out one lies below them."""
    m = ranks - 1
    return max(1, m // 2), m // 2 + 2


def _others_median(i: Interval, position: int) -> float | None:
    """statistics.median of the interval's step times but the one at `position` (1-based, ascending)."""
    m = i.ranks - 1
    if m < 1:
        return None

    def kth(k: int) -> float:
        return _order_statistic(i, k if k < position else k + 1)

    try:
        return kth((m + 1) // 2) if m % 2 else (kth(m // 2) + kth(m // 2 + 1)) / 2
    except ValueError:  # the summaries do not hold the interval's ranks (yet)
        return None


def rank_ratio(i: Interval, rank: int, limit: float) -> tuple[bool | None, float | None]:
    """(breach, ratio) of `rank` in interval `i`: its step time over the median of the other ranks'.
    A rank below the slowest kept is judged by the least of them, which bounds its ratio (its time
    is no longer, the others' median no shorter): no breach where that bound is within the limit,
    undecided otherwise; a rank that did not send the interval is undecided."""
    for j, (kept_rank, time) in enumerate(i.slowest):
        if kept_rank == rank:
            median = _others_median(i, i.ranks - j)
            if not median:
                return None, None
            return time / median > limit, time / median
    if i.ranks <= len(i.slowest) or not i.slowest:
        return None, None  # every rank is kept: this one did not send it
    bound_median = _others_median(i, i.ranks - len(i.slowest) + 1)
    if bound_median and i.slowest[-1][1] / bound_median <= limit:
        return False, None
    return None, None


def straggler(facts: RunFacts, windows: Windows, t: Thresholds) -> Verdicts:
    """A rank whose step time is above the median of the other ranks' by straggler_pct. Judged
    from the rank summaries: the ranks among an interval's slowest, and those with an open alert."""
    intervals = [*windows.baseline, *windows.later]
    limit = 1.0 + t.straggler_pct / 100.0
    opened = {int(s.removeprefix("rank ")) for (rule, s), v in facts.reported.items()
              if rule == "straggler" and v == math.inf and s.startswith("rank ")}  # fmt: skip
    ranks = sorted({r for i in intervals for r, _ in i.slowest} | opened)
    out: Verdicts = {}
    for rank in ranks:
        judged = [rank_ratio(i, rank, limit) for i in intervals]
        breaches = [(i.interval, b) for i, (b, _) in zip(intervals, judged, strict=True)]
        subject = f"rank {rank}"
        n = t.straggler_intervals
        state, fired = judged_streak(breaches, n, n, facts.reported_through("straggler", subject))
        if state is False:
            out[subject] = CLEAR
        elif state:
            recent = [x for i, (_, x) in zip(intervals, judged, strict=True) if i.interval in fired and x is not None]
            host = facts.hosts.get(rank)
            slower = 100.0 * (statistics.median(recent) - 1.0)
            where = f"on {host}" if host else "host not reported"
            summary = f"rank {rank} ({where}) is {slower:.0f}% slower than the other ranks' median step time"
            details = {"rank": rank, "host": host, "slower_pct": slower, "ratios": recent,
                       "threshold_pct": t.straggler_pct, "intervals": fired}  # fmt: skip
            out[subject] = Firing(summary, details, LEDGER_TERM["straggler"])
    return out


def _site_rates(window: Sequence[Interval]) -> dict[str, float]:
    counted = sum(sync_counted_steps(i.sums) for i in window)
    totals: dict[str, float] = {}
    for i in window:
        for site, n in i.sites.items():
            totals[site] = totals.get(site, 0.0) + n
    return {site: n / counted for site, n in totals.items()} if counted else {}


def sync_regression(facts: RunFacts, windows: Windows, t: Thresholds) -> Verdicts:
    """Host syncs per iteration above the baseline's median; names the site that grew most."""
    c = facts.coefficients

    def per_iter(i: Interval) -> float | None:
        return _metric("syncs_per_iter", i.sums, c)  # None where the agent did not count (sampling)

    base = [v for v in map(per_iter, windows.baseline) if v is not None]
    if not base or not windows.later:
        return {}
    baseline = statistics.median(base)
    limit = baseline + max(t.sync_min_increase, baseline * t.sync_increase_pct / 100.0)
    values = [per_iter(i) for i in windows.later]
    breaches = [(i.interval, None if v is None else v > limit) for i, v in zip(windows.later, values, strict=True)]
    n = t.sync_intervals
    state, fired = judged_streak(breaches, n, n, facts.reported_through("sync_regression"))
    if not state:
        return {} if state is None else {"": CLEAR}
    recent = [i for i in windows.later if i.interval in fired]
    now = _metric("syncs_per_iter", _window_sums(recent), c) or 0.0
    before, after = _site_rates([i for i in windows.baseline if per_iter(i) is not None]), _site_rates(recent)
    growth = {site: rate - before.get(site, 0.0) for site, rate in after.items()}
    site = max(growth, key=lambda s: (growth[s], s)) if growth else ""
    summary = f"{now:.3g} host syncs per iteration against a baseline of {baseline:.3g}"
    if site:
        summary += f"; new at {site} (+{growth[site]:.3g} per iteration)"
    details = {"baseline": baseline, "recent": now, "limit": limit, "site": site or None,
               "site_increase_per_iter": growth.get(site), "intervals": [i.interval for i in recent]}  # fmt: skip
    return {"": Firing(summary, details, LEDGER_TERM["sync_regression"], subject=site)}


def nonfinite_loss(intervals: Sequence[Interval], t: Thresholds, reported: float | None = None) -> Verdicts:
    """A loss sent as NaN or ±inf opens at once; nonfinite_resolve_intervals finite ones resolve.
    `reported`: the latest interval an alert of the rule covered (judged_streak)."""
    ordered = sorted(intervals, key=lambda i: i.interval)
    breaches = [
        (i.interval, True if i.nonfinite_loss else (False if i.sums["loss_tokens"] > 0 else None)) for i in ordered
    ]
    state, _ = judged_streak(breaches, 1, t.nonfinite_resolve_intervals, reported)
    if not state:
        return {} if state is None else {"": CLEAR}
    latest = max(i.interval for i in ordered if i.nonfinite_loss)
    summary = f"the loss is not finite (NaN or ±inf) at interval {latest}"
    return {"": Firing(summary, {"interval": latest})}


def mfu_floor(facts: RunFacts, windows: Windows, t: Thresholds) -> Verdicts:
    """Useful MFU below the project's floor for mfu_floor_intervals intervals; off without a floor."""
    if t.mfu_floor is None:
        return {"": CLEAR}
    c = facts.coefficients
    intervals = [*windows.baseline, *windows.later]
    values = [_metric("mfu_useful", i.sums, c) for i in intervals]
    n = t.mfu_floor_intervals
    breaches = [(i.interval, None if v is None else v < t.mfu_floor) for i, v in zip(intervals, values, strict=True)]
    state, fired = judged_streak(breaches, n, n, facts.reported_through("mfu_floor"))
    if not state:
        return {} if state is None else {"": CLEAR}
    recent = [i for i in intervals if i.interval in fired]
    mfu = _metric("mfu_useful", _window_sums(recent), c) or 0.0
    losses = _ledger_ms(recent, facts)
    term = max(losses, key=lambda k: losses[k]) if losses else None
    summary = f"useful MFU {mfu:.1%} is below the project's floor of {t.mfu_floor:.1%}"
    if term:
        summary += f"; the ledger's largest measured loss is {term}"
    details = {"mfu_useful": mfu, "floor": t.mfu_floor, "intervals": [i.interval for i in recent]}
    return {"": Firing(summary, details, term)}


def judge(facts: RunFacts, intervals: Sequence[Interval], t: Thresholds) -> dict[str, Verdicts]:
    """Every rule's verdicts on a run: rule -> subject -> FIRING or CLEAR."""
    windows = Windows.of(intervals, t)
    return {
        "stalled": stalled(facts, intervals, t),
        "crashed": crashed(facts, t),
        "slowdown": slowdown(facts, windows, t),
        "straggler": straggler(facts, windows, t),
        "sync_regression": sync_regression(facts, windows, t),
        "nonfinite_loss": nonfinite_loss(intervals, t, facts.reported_through("nonfinite_loss")),
        "mfu_floor": mfu_floor(facts, windows, t),
    }
