"""agent/gpu_idle.py on synthetic CUPTI activity: busy, idle after a host sync (by site), other
idle, and the time between steps left to the data wait. Times in µs, as ns."""

import random

import pytest

from packscope.agent.gpu_idle import UNKNOWN_SITE, Busy, HostSync, attribute_idle, merged

US = 1_000


def busy(*spans: tuple[int, int], copy_at: int | None = None) -> list[Busy]:
    return [Busy(a * US, b * US, blocking_copy=(a == copy_at)) for a, b in spans]


def test_back_to_back_kernels_leave_no_idle():
    split = attribute_idle(busy((0, 10), (10, 30), (30, 35)), [], [], [(0, 40 * US)])
    assert split.busy_s == pytest.approx(35e-6)
    assert (split.sync_idle_s, split.launch_idle_s, split.between_steps_s) == (0, 0, 0)


def test_overlapping_streams_are_busy_once():
    assert merged(busy((0, 10), (5, 20), (8, 12), (25, 30))) == [(0, 20 * US, False), (25 * US, 30 * US, False)]
    split = attribute_idle(busy((0, 10), (5, 20), (25, 30)), [], [], [(0, 40 * US)])
    assert split.busy_s == pytest.approx(25e-6)
    assert split.launch_idle_s == pytest.approx(5e-6)  # no sync before the gap: the host was late


def test_idle_after_a_sync_is_charged_to_the_site_recorded_before_it():
    # The host syncs at 8 µs (site marked at 7), waits until the GPU drains at 20, returns at 21,
    # and launches again at 50: 30 µs of idle the sync cost.
    split = attribute_idle(
        busy((0, 20), (50, 60)),
        [HostSync(8 * US, 21 * US)],
        [(2 * US, "other.py:1"), (7 * US, "train.py:88 in step")],
        [(0, 70 * US)],
    )
    assert split.sync_idle_s == pytest.approx(30e-6)
    assert split.launch_idle_s == 0
    assert split.sync_sites == {"train.py:88 in step": pytest.approx(30e-6)}


def test_a_sync_on_an_already_idle_gpu_costs_nothing_the_gap_is_launch_bound():
    # The GPU drained at 20; the host only reached its sync at 30 (it was slow to launch): the
    # sync returned at once, and the idle time is the host's, not the sync's.
    split = attribute_idle(busy((0, 20), (50, 60)), [HostSync(30 * US, 31 * US)], [(29 * US, "a.py:1")], [(0, 70 * US)])
    assert split.sync_idle_s == 0
    assert split.launch_idle_s == pytest.approx(30e-6)


def test_a_blocking_copy_to_pageable_memory_is_a_sync():
    split = attribute_idle(busy((0, 10), (10, 12), (40, 50), copy_at=10), [], [(5 * US, "loss.py:3")], [(0, 60 * US)])
    assert split.sync_idle_s == pytest.approx(28e-6)
    assert split.sync_sites == {"loss.py:3": pytest.approx(28e-6)}


def test_without_a_site_the_idle_is_still_a_syncs_under_unknown():
    split = attribute_idle(busy((0, 20), (40, 50)), [HostSync(5 * US, 20 * US)], [], [(0, 60 * US)])
    assert split.sync_sites == {UNKNOWN_SITE: pytest.approx(20e-6)}


def test_the_time_between_steps_is_left_to_the_data_wait():
    # Step 1 ends (host) at 22, step 2 begins at 45; the GPU idles 20..50. The part between the
    # steps (22..45) is the data wait's; 20..22 and 45..50 are inside the steps, after no sync.
    split = attribute_idle(busy((0, 20), (50, 70)), [], [], [(0, 22 * US), (45 * US, 80 * US)])
    assert split.between_steps_s == pytest.approx(23e-6)
    assert split.launch_idle_s == pytest.approx(7e-6)
    assert split.sync_idle_s == 0


def test_a_sync_at_a_steps_end_then_a_data_wait_splits_the_gap():
    # loss.item() at the end of step 1: the host waits 10..20, step 1 ends at 24, the loader
    # keeps the host until 60, step 2 launches at 62. 20..24 and 60..62 inside the steps follow
    # the sync (the host had to refill the queue); 24..60 is the data wait.
    split = attribute_idle(
        busy((0, 20), (62, 80)),
        [HostSync(10 * US, 21 * US)],
        [(9 * US, "train.py:5 in log")],
        [(0, 24 * US), (60 * US, 90 * US)],
    )
    assert split.between_steps_s == pytest.approx(36e-6)
    assert split.sync_idle_s == pytest.approx(6e-6)
    assert split.launch_idle_s == 0
    # The sync drained the queue at the step's end, so of the time between the steps it owns as
    # much as that queue (its 11 µs wait: without it the host would have been that far ahead);
    # the loader's wait beyond it stays the data wait's. Over the one gap between the steps.
    assert (split.sync_idle_between_s, split.traced_gaps) == (pytest.approx(11e-6), 1)


def test_idle_between_steps_that_no_sync_began_stays_the_data_waits():
    # Step 1's last kernel ends at 20 with no sync: the host ends the step at 22 and waits for its
    # batch until 45. The gap is the loader's, not the syncs'.
    split = attribute_idle(busy((0, 20), (50, 70)), [], [], [(0, 22 * US), (45 * US, 80 * US)])
    assert (split.between_steps_s, split.sync_idle_between_s, split.traced_gaps) == (pytest.approx(23e-6), 0, 1)


def test_a_gap_between_steps_holding_the_agents_work_is_left_out_of_the_syncs_between_steps():
    # Three steps, each ending with a sync (at 5..21 and 105..121) into a gap across the step's
    # end (20..40, 120..140 between steps at 24..36 and 124..136). The agent emitted an interval
    # in the second gap (agent_gaps={1}): only the first one's 12 µs count, over one gap.
    steps = [(0, 24 * US), (36 * US, 124 * US), (136 * US, 200 * US)]
    timeline = busy((0, 20), (40, 120), (140, 160))
    syncs = [HostSync(5 * US, 21 * US), HostSync(105 * US, 121 * US)]
    every = attribute_idle(timeline, syncs, [], steps)
    assert (every.sync_idle_between_s, every.traced_gaps) == (pytest.approx(24e-6), 2)
    left_out = attribute_idle(timeline, syncs, [], steps, agent_gaps={1})
    assert (left_out.sync_idle_between_s, left_out.traced_gaps) == (pytest.approx(12e-6), 1)
    # The rest of the split is the same: the agent's gap is still between steps, not inside one.
    assert (left_out.between_steps_s, left_out.sync_idle_s) == (every.between_steps_s, every.sync_idle_s)


def test_a_sync_that_drained_the_queue_owns_the_idle_between_steps_up_to_that_queue():
    # The legacy logger: `.item()` at the end of step 1 waits 10..101 for the queued work (the
    # GPU drains at 100); the agent's own small kernels run at the step's end (104..106); the
    # host's work for the next step keeps it until 140, and step 2 launches at 142. The idle gap
    # 106..142 began with no sync, but the queue was empty since the sync: the 34 µs between the
    # steps are the sync's (without it the host would have been 91 µs ahead, more than enough).
    steps = [(0, 104 * US), (140 * US, 190 * US)]
    split = attribute_idle(busy((0, 100), (104, 106), (142, 160)), [HostSync(10 * US, 101 * US)], [], steps)
    assert split.between_steps_s == pytest.approx(34e-6)
    assert (split.sync_idle_between_s, split.traced_gaps) == (pytest.approx(34e-6), 1)
    # A launch-bound host: the sync found only 11 µs queued (90..101). Without it the host's work
    # between the steps would have overlapped those 11 µs and idled the GPU for the rest anyway.
    split = attribute_idle(busy((0, 100), (104, 106), (142, 160)), [HostSync(90 * US, 101 * US)], [], steps)
    assert split.sync_idle_between_s == pytest.approx(11e-6)
    # After the sync the host queued more than a few small kernels (a backward: 101..400 µs
    # busy) before the step's end: the host got ahead again, and the gap is the data wait's.
    steps = [(0, 404 * US), (440 * US, 500 * US)]
    split = attribute_idle(busy((0, 100), (101, 400), (442, 460)), [HostSync(10 * US, 101 * US)], [], steps)
    assert split.between_steps_s == pytest.approx(36e-6)
    assert split.sync_idle_between_s == 0


def test_the_hosts_blocked_time_is_its_sync_calls_union_inside_the_steps_and_the_counted_gaps():
    # Step 0 (0..50) syncs at 10..30 and, overlapping it (a nested wait), 25..35: 25 µs blocked,
    # not 30. A blocking copy 40..44 with no sync record around it: 4 µs more. Between steps 0
    # and 1 (50..60) the trainer's own sync 52..58 (after the agent's step_end): 6 µs between.
    # A sync straddling step 1's end (95..105) counts its part in the step (5) and in the gap (5);
    # the gap after step 1 holds the agent's work (agent_gaps={1}), so its part is left out.
    steps = [(0, 50 * US), (60 * US, 100 * US), (110 * US, 150 * US)]
    syncs = [
        HostSync(10 * US, 30 * US),
        HostSync(25 * US, 35 * US),
        HostSync(52 * US, 58 * US),
        HostSync(95 * US, 105 * US),
    ]
    timeline = busy((0, 30), (40, 44), (60, 90), (110, 140), copy_at=40)
    split = attribute_idle(timeline, syncs, [], steps)
    assert split.blocked_s == pytest.approx(34e-6)  # 25 + 4 + 5
    assert split.blocked_between_s == pytest.approx(11e-6)  # 6 + 5
    left_out = attribute_idle(timeline, syncs, [], steps, agent_gaps={1})
    assert (left_out.blocked_s, left_out.blocked_between_s) == (split.blocked_s, pytest.approx(6e-6))
    # Outside the traced span (before the first step's begin) nothing counts; without syncs, 0.
    assert attribute_idle(timeline, [HostSync(-20 * US, -1 * US)], [], steps).blocked_s == pytest.approx(4e-6)
    assert attribute_idle(busy((0, 30)), [], [], steps).blocked_s == 0
    # Measured even where the GPU ran nothing in the trace.
    assert attribute_idle([], [HostSync(10 * US, 20 * US)], [], steps).blocked_s == pytest.approx(10e-6)


def test_the_parts_add_up_to_the_span_on_random_timelines():
    rng = random.Random(3)
    for _ in range(200):
        t, spans, syncs, sites = 0, [], [], []
        for _ in range(rng.randint(1, 30)):
            t += rng.choice([0, 0, rng.randint(1, 50)])
            length = rng.randint(1, 40)
            spans.append((t, t + length))
            if rng.random() < 0.2:
                sites.append((t * US, f"s{rng.randint(0, 3)}.py:1"))
                syncs.append(HostSync(t * US, (t + length + rng.randint(0, 3)) * US))
            t += length if rng.random() < 0.8 else length // 2  # some overlap
        steps = sorted(rng.sample(range(t + 10), 4))
        step_spans = [(steps[0] * US, steps[1] * US), (steps[2] * US, steps[3] * US)]
        split = attribute_idle(busy(*spans), syncs, sorted(sites), step_spans)
        stretches = merged(busy(*spans))
        span = (stretches[-1][1] - stretches[0][0]) / 1e9
        total = split.busy_s + split.sync_idle_s + split.launch_idle_s + split.between_steps_s
        assert total == pytest.approx(span, abs=1e-12)
        assert sum(split.sync_sites.values()) == pytest.approx(split.sync_idle_s, abs=1e-12)
        assert min(split.busy_s, split.sync_idle_s, split.launch_idle_s, split.between_steps_s) >= 0
        assert 0 <= split.sync_idle_between_s <= split.between_steps_s + 1e-12


def test_the_hosts_blocked_time_is_a_microsecond_count_of_its_waits_on_random_timelines():
    """Against a brute force: every microsecond that some sync call or blocking copy covers,
    counted once, inside a step or in a counted gap between steps."""
    rng = random.Random(11)
    for _ in range(200):
        syncs = []
        for _ in range(rng.randint(0, 12)):
            a = rng.randint(0, 300)
            syncs.append(HostSync(a * US, (a + rng.randint(0, 60)) * US))
        copies = [(a, a + rng.randint(1, 20)) for a in rng.sample(range(300), rng.randint(0, 3))]
        edges = sorted(rng.sample(range(1, 400), 6))
        steps = [(edges[i] * US, edges[i + 1] * US) for i in (0, 2, 4)]
        agent_gaps = {g for g in (0, 1) if rng.random() < 0.3}
        timeline = [Busy(a * US, b * US, blocking_copy=True) for a, b in copies] + busy((0, 1))
        split = attribute_idle(timeline, syncs, [], steps, agent_gaps=agent_gaps)
        covered = {us for s in syncs for us in range(s.start // US, s.end // US)}
        covered |= {us for a, b in copies for us in range(a, b)}
        inside = sum(1 for a, b in steps for us in range(a // US, b // US) if us in covered)
        gaps = [(steps[k][1], steps[k + 1][0]) for k in (0, 1) if k not in agent_gaps]
        between = sum(1 for a, b in gaps for us in range(a // US, b // US) if us in covered)
        assert split.blocked_s == pytest.approx(inside * 1e-6, abs=1e-12)
        assert split.blocked_between_s == pytest.approx(between * 1e-6, abs=1e-12)


class FakeCupti:
    """The parts of cupti-python's module that IdleTracer uses."""

    class ActivityKind:
        CONCURRENT_KERNEL, MEMCPY, MEMSET, SYNCHRONIZATION = 10, 1, 2, 38

    def __init__(self) -> None:
        self.enabled: set[int] = set()
        self.completed = None

    def activity_register_callbacks(self, requested, completed):
        self.completed = completed

    def activity_enable(self, kind):
        self.enabled.add(kind)

    def activity_disable(self, kind):
        self.enabled.discard(kind)

    def activity_flush_all(self, flag):
        pass


def test_the_tracer_reads_cuptis_records_as_busy_and_host_syncs():
    from types import SimpleNamespace as Record

    from packscope.agent.cupti import IdleTracer

    cupti = FakeCupti()
    tracer = IdleTracer(cupti)
    tracer.start()
    assert cupti.enabled == {10, 1, 2, 38}
    kinds = FakeCupti.ActivityKind
    cupti.completed([
        Record(kind=kinds.CONCURRENT_KERNEL, start=100, end=200),
        Record(kind=kinds.MEMCPY, start=200, end=210, copy_kind=2, dst_kind=1),  # to pageable host memory
        Record(kind=kinds.MEMCPY, start=300, end=310, copy_kind=2, dst_kind=2),  # to pinned memory
        Record(kind=kinds.MEMSET, start=400, end=405),
        Record(kind=kinds.SYNCHRONIZATION, start=150, end=211, type=3),  # a stream synchronize
        Record(kind=kinds.SYNCHRONIZATION, start=150, end=151, type=2),  # a stream's wait: no host blocks
        Record(kind=kinds.CONCURRENT_KERNEL, start=0, end=0),  # never timed
    ])  # fmt: skip
    tracer.stop()
    assert cupti.enabled == set()
    busy, syncs = tracer.take()
    assert busy == [Busy(100, 200), Busy(200, 210, True), Busy(300, 310), Busy(400, 405)]
    assert syncs == [HostSync(150, 211)]
    assert tracer.dropped == 1 and tracer.take() == ([], [])


def per_document_loop(docs: int) -> tuple[list[Busy], list[HostSync], list[tuple[int, str]]]:
    """A step that reads `.item()` per document (trainer/channel_loss.py's loop), in µs: the forward
    runs 0..100 and the first read waits for it (sync 60..101); then per document d (base
    101 + 30 d) the host runs Python, launches two tiny kernels (base+12..14, base+16..18) and
    reads again at base+25 on a GPU that is already idle (the sync returns at once). The
    backward is launched at 500."""
    spans, syncs, sites = [(0, 100)], [HostSync(60 * US, 101 * US)], [(59 * US, "loss.py:102")]
    for d in range(docs):
        base = 101 + 30 * d
        spans += [(base + 12, base + 14), (base + 16, base + 18)]
        syncs.append(HostSync((base + 25) * US, (base + 26) * US))  # on an idle GPU: no wait
        sites.append(((base + 24) * US, "loss.py:103"))
    spans.append((500, 800))
    return busy(*spans), syncs, sites


def test_idle_between_syncs_that_return_at_once_is_the_syncs_a_per_document_loop():
    records, syncs, sites = per_document_loop(10)
    split = attribute_idle(records, syncs, sites, [(0, 810 * US)])
    # By hand: the first read waited for the forward (the gap 100..113 follows it); each
    # document's kernels leave 2 µs between them and 24 µs before the next document's; the last
    # read begins at 101 + 30 * 9 + 25 = 396, 7 µs after the last kernel (389). The rest of that
    # gap, 396..500, follows a read that found the GPU idle: the host's own time, launch-bound.
    first_wait, own, between, last = 13, 10 * 2, 9 * 24, 396 - 389
    assert split.sync_idle_s == pytest.approx((first_wait + own + between + last) * 1e-6)
    assert split.launch_idle_s == pytest.approx((500 - 396) * 1e-6)
    # The old rule (only a gap the host waited into) gave the loop 13 µs and the host 347 µs.
    # Each region's idle goes to the site recorded before the read that opened it.
    # The first read's region runs to the second read (126): its wait, 115..117 and 119..126.
    assert split.sync_sites["loss.py:102"] == pytest.approx((first_wait + 2 + 7) * 1e-6)
    total = first_wait + own + between + last
    assert split.sync_sites["loss.py:103"] == pytest.approx((total - first_wait - 2 - 7) * 1e-6)
    # All of it lies in the loop (the first read's begin, 60, to the last one's, 396), and the
    # ten reads that closed its regions each waited 1 µs.
    assert split.loop_idle_s == pytest.approx(total * 1e-6)
    assert split.loop_blocked_s == pytest.approx(10e-6)


def test_a_region_whose_closing_sync_found_a_queue_stays_launch_bound():
    # Legacy logging's step: synchronize at its begin (0..1, the GPU idle); the forward and
    # backward, launched slowly (gaps 10..20, 40..50), with 400 µs of work queued by the time the
    # NaN check's first read begins (600): it waits until 1000, so the host had got ahead, and
    # those gaps are launch-bound. Then per bucket a few tiny kernels and a read that waits for
    # them alone (≤ 100 µs): the gaps between the reads are the syncs'.
    spans = [(2, 10), (20, 40), (50, 1000), (1010, 1012), (1030, 1032), (1050, 1052)]
    syncs = [HostSync(0, 1 * US), HostSync(600 * US, 1001 * US), HostSync(1011 * US, 1013 * US)]
    syncs += [HostSync(1031 * US, 1033 * US), HostSync(1051 * US, 1053 * US)]
    sites = [(0, "log.py:39"), (599 * US, "log.py:48"), (1010 * US, "log.py:48b"), (1030 * US, "log.py:48c")]
    split = attribute_idle(busy(*spans), syncs, sites, [(0, 1060 * US)])
    assert split.launch_idle_s == pytest.approx(20e-6)  # 10..20 and 40..50: the region 0..600 is not the syncs'
    # 1000..1010 follows the first read (it waited into it); 1012..1030 and 1032..1050 lie
    # between reads that each waited 2 µs.
    assert split.sync_idle_s == pytest.approx(46e-6)
    assert split.sync_sites == {
        "log.py:48": pytest.approx(10e-6),
        "log.py:48b": pytest.approx(18e-6),
        "log.py:48c": pytest.approx(18e-6),
    }
    # The loop runs from the first read's begin (600) to the last one's (1051): all 46 µs, and
    # its three closing reads waited 2 µs each; the region 0..600 is none of it.
    assert (split.loop_idle_s, split.loop_blocked_s) == (pytest.approx(46e-6), pytest.approx(6e-6))


def test_syncs_in_two_steps_bracket_nothing_between_them():
    # A sync near step 1's end and one at step 2's begin: the host time between the steps is the
    # data wait's, and the launch gap inside step 2 before its first sync stays launch-bound.
    split = attribute_idle(
        busy((0, 10), (15, 20), (60, 70), (80, 90)),
        [HostSync(13 * US, 14 * US), HostSync(75 * US, 76 * US)],
        [(12 * US, "a.py:1"), (74 * US, "b.py:2")],
        [(0, 30 * US), (50 * US, 100 * US)],
    )
    assert split.between_steps_s == pytest.approx(20e-6)  # 30..50
    assert split.sync_idle_s == 0  # one sync a step: no region, and neither waited for the GPU
    assert split.launch_idle_s == pytest.approx((5 + 10 + 10 + 10) * 1e-6)  # 10..15, 20..30, 50..60, 70..80
    assert (split.loop_idle_s, split.loop_blocked_s) == (0, 0)
