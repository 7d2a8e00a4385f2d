"""batches.PendingSteps: what the integrations keep between a step's end and its observation."""

from packscope.agent.integrations.batches import PENDING_FORWARDS, PendingSteps


def _pending() -> tuple[PendingSteps[str], list[str]]:
    seen: list[str] = []
    return PendingSteps[str](seen.append), seen


def test_the_first_step_is_observed_when_it_ends_so_a_bad_batch_fails_at_once():
    pending, seen = _pending()
    pending.end_step("step 1", micro_batches=2)
    assert seen == ["step 1"]
    pending.end_step("step 2", micro_batches=2)
    assert seen == ["step 1"]  # kept from now on


def test_steps_are_kept_until_the_boundary_then_observed_in_order():
    pending, seen = _pending()
    pending.end_step("step 1", 1)
    for n in range(2, 6):
        pending.end_step(f"step {n}", 1)
    assert seen == ["step 1"]
    pending.observe()  # Agent.before_boundary
    assert seen == [f"step {n}" for n in range(1, 6)]
    pending.observe()  # nothing twice
    assert len(seen) == 5


def test_no_more_than_pending_forwards_micro_batches_are_kept():
    pending, seen = _pending()
    pending.end_step("first", 1)
    kept_most = 0
    for n in range(200):
        pending.end_step(f"step {n}", 3)
        kept_most = max(kept_most, 3 * (n + 2 - len(seen)))
    assert 0 < kept_most < PENDING_FORWARDS  # the step that reaches the bound is observed with the rest
    assert seen == ["first", *(f"step {n}" for n in range(len(seen) - 1))]  # in order, none skipped


def test_a_step_with_a_large_tensor_is_observed_when_it_ends():
    pending, seen = _pending()
    pending.end_step("step 1", 1)
    pending.end_step("step 2", 1)
    pending.heavy = True
    pending.end_step("step 3", 1)
    assert seen == ["step 1", "step 2", "step 3"] and not pending.heavy


def test_steps_without_micro_batches_do_not_count_as_the_first_observed():
    pending, seen = _pending()
    pending.end_step("empty", 0)
    pending.end_step("step 2", 2)
    assert seen == ["empty", "step 2"]  # the first with micro-batches is still observed at once


def test_a_full_store_can_be_left_to_the_caller():
    """The HF callback observes a full store in its next forward hook (the GPU busy), not when
    the step ends (observe_full_at_step_end=False); the first and heavy steps still go at once."""
    seen: list[str] = []
    pending = PendingSteps[str](seen.append, observe_full_at_step_end=False)
    pending.end_step("first", 1)
    for n in range(PENDING_FORWARDS):
        pending.end_step(f"step {n}", 1)
    assert pending.full and seen == ["first"]
    pending.observe()
    assert not pending.full and len(seen) == 1 + PENDING_FORWARDS
    pending.heavy = True
    pending.end_step("heavy", 1)
    assert seen[-1] == "heavy"
