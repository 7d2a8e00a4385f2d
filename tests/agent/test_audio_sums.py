"""The agent's device audio sums (packscope.agent.audio) against the reference sums of the same clips
(packscope.core.audio.call_sums, packscope.core.audio_gemma4.call_sums), call by call and summed over
an interval's calls, for both towers; and the FLOPs they price, per component."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from packscope.agent.audio import interval_sums  # noqa: E402
from packscope.core.audio import AUDIO_SUMS, AudioSpec  # noqa: E402
from packscope.core.audio import call_sums as omni_call_sums  # noqa: E402
from packscope.core.audio_gemma4 import GEMMA4_AUDIO_SUMS, Gemma4AudioSpec  # noqa: E402
from packscope.core.audio_gemma4 import call_sums as gemma4_call_sums  # noqa: E402
from packscope.core.audio_sums import AUDIO_RECORD_SUMS  # noqa: E402

OMNI = {
    window: AudioSpec(
        tower="qwen3_omni", layers=2, hidden=16, heads=2, ffn=32, mel_bins=16, conv_channels=4, n_window=50,
        n_window_infer=window, projector=((16, 16), (16, 24)),
    )
    for window in (100, 200, 800)
}  # fmt: skip
GEMMA4 = {
    (chunk, left, right): Gemma4AudioSpec(
        tower="gemma4", layers=2, hidden=16, heads=2, ffn=32, conv_channels=(8, 4), mel_bins=8, lconv_kernel=5,
        chunk=chunk, context_left=left, context_right=right, projector=((16, 24), (24, 32)),
    )
    for chunk, left, right in ((12, 13, 0), (4, 3, 2))
}  # fmt: skip
# Interval's calls, each one micro-batch's clips in mel frames: short clips alone, a full chunk, clips of
# several chunks with tails beside short ones, clips that fill several windows, a lone frame.
CALLS = [
    [[30]],
    [[64, 30], [100]],
    [[250, 70], [120, 437, 9]],
    [[800, 801], [1650, 90], [1]],
    [[3000, 1000], [3000], [1000, 50]],
]


def mask(clips: list[int], padded: int | None = None, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A feature extractor's mask: each clip's frames first, padded to the call's length."""
    out = torch.zeros(len(clips), padded or max(clips), dtype=dtype)
    for i, n in enumerate(clips):
        out[i, :n] = 1
    return out


def reference(one_call, names, calls) -> dict[str, int]:
    out = dict.fromkeys(AUDIO_RECORD_SUMS, 0)
    for clips in calls:
        for name, value in one_call(clips).items():
            assert name in names
            out[name] += value
    return out


def as_ints(sums: dict) -> dict[str, int]:
    return {name: int(value) for name, value in sums.items()}


@pytest.mark.parametrize("calls", CALLS, ids=lambda c: "_".join("-".join(map(str, x)) for x in c))
@pytest.mark.parametrize("window", OMNI)
def test_qwen3_omni_device_sums_are_the_reference(window, calls):
    audio = OMNI[window]
    want = reference(lambda clips: omni_call_sums(audio, clips), AUDIO_SUMS, calls)
    got = interval_sums(audio, [("feature_attention_mask", mask(c)) for c in calls], torch.device("cpu"))
    assert as_ints(got) == want and want["audio_sq_sum"] > 0
    lengths = interval_sums(
        audio, [("audio_feature_lengths", torch.tensor(c)) for c in calls], torch.device("cpu")
    )  # the same clips as lengths
    assert as_ints(lengths) == want
    assert audio.flops_by_component(got) == audio.flops_by_component(want)


@pytest.mark.parametrize("calls", CALLS, ids=lambda c: "_".join("-".join(map(str, x)) for x in c))
@pytest.mark.parametrize("blocks", GEMMA4)
def test_gemma4_device_sums_are_the_reference_at_the_calls_padded_length(blocks, calls):
    audio = GEMMA4[blocks]
    padded = [max(c) + k for k, c in enumerate(calls)]  # the extractor may pad past the longest clip
    want = dict.fromkeys(AUDIO_RECORD_SUMS, 0)
    for clips, length in zip(calls, padded, strict=True):
        for name, value in gemma4_call_sums(audio, clips, length).items():
            assert name in GEMMA4_AUDIO_SUMS
            want[name] += value
    got = interval_sums(
        audio,
        [("input_features_mask", mask(c, t, torch.bool)) for c, t in zip(calls, padded, strict=True)],
        torch.device("cpu"),
    )
    assert as_ints(got) == want and want["audio_blocks"] > 0
    assert audio.flops_by_component(got) == audio.flops_by_component(want)


def test_random_clips_in_random_calls():
    rng = random.Random(38)
    for _ in range(40):
        calls = [[rng.randint(1, 2500) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(1, 4))]
        for audio in OMNI.values():
            want = reference(lambda clips, a=audio: omni_call_sums(a, clips), AUDIO_SUMS, calls)
            got = interval_sums(audio, [("feature_attention_mask", mask(c)) for c in calls], torch.device("cpu"))
            assert as_ints(got) == want, calls
        for audio in GEMMA4.values():
            want = reference(lambda clips, a=audio: gemma4_call_sums(a, clips), GEMMA4_AUDIO_SUMS, calls)
            got = interval_sums(
                audio, [("input_features_mask", mask(c, None, torch.bool)) for c in calls], torch.device("cpu")
            )
            assert as_ints(got) == want, calls


def test_a_row_of_no_frames_is_no_clip_of_qwen3_omni_and_a_padded_row_of_gemma4():
    """Qwen3-Omni's tower takes no chunk of an empty row; Gemma 4's runs every row of its call."""
    omni = OMNI[800]
    rows = mask([250, 70, 1])
    rows[2] = 0
    got = as_ints(interval_sums(omni, [("feature_attention_mask", rows)], torch.device("cpu")))
    assert got == reference(lambda clips: omni_call_sums(omni, clips), AUDIO_SUMS, [[250, 70]])
    gemma = GEMMA4[(12, 13, 0)]
    rows = mask([250, 70, 1], None, torch.bool)
    rows[2] = False
    got = as_ints(interval_sums(gemma, [("input_features_mask", rows)], torch.device("cpu")))
    want = gemma4_call_sums(gemma, [250, 70, 1])
    assert got["audio_positions"] == want["audio_positions"] and got["audio_clips"] == 3
    assert got["audio_tokens"] == want["audio_tokens"] - 1  # the empty row hands the decoder no token


def test_a_mask_of_the_wrong_shape_or_kind_is_refused_by_name():
    from packscope.agent.audio import call_of

    omni = OMNI[800]
    with pytest.raises(ValueError, match=r"feature_attention_mask must be \[clips, frames\]"):
        call_of(omni, {"feature_attention_mask": torch.ones(3, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"audio_feature_lengths must be \[clips\]"):
        call_of(omni, {"audio_feature_lengths": torch.ones(2, 3, dtype=torch.long)})
    with pytest.raises(ValueError, match="must hold integers or booleans"):
        call_of(omni, {"feature_attention_mask": torch.ones(2, 3)})
    assert call_of(omni, {"input_features_mask": torch.ones(2, 3)}) is None  # Gemma 4's key: not this tower's


# -- Agent.observe_batch and the record ------------------------------------------------------------


def _model(audio):
    from packscope.core.flops import ModelSpec

    return ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=1000, audio=audio)


def test_observe_batch_takes_the_clips_and_the_server_accepts_the_record():
    """The agent's own API: each micro-batch's mask beside its text form; the record carries the
    interval's sums (those of its calls), its FLOPs add the tower's to every view, and the
    server's decoder takes the record as it is."""
    import json

    from packscope.agent import Agent, AgentConfig
    from packscope.backend.ingest.record import decode

    audio = OMNI[800]
    calls = [[250, 70], [1650, 90, 30]]
    agent = Agent(AgentConfig(log_every=1, count_syncs=False), model=_model(audio))
    agent.step_begin()
    for clips in calls:
        agent.observe_batch(shape=(1, 16), feature_attention_mask=mask(clips))
    agent.step_end()
    agent.close()
    (record,) = agent.records
    want = audio.batch_sums(calls)
    assert {name: record[name] for name in want} == want
    text = _model(None).triad_by_kind(32, 32, {"seqlen_sq_sum_thd": 2 * 16**2, "seqlen_sq_sum_bshd": 2 * 16**2})
    assert record["flops_thd"] == float(text["thd"] + audio.flops(want))
    checked = decode(json.dumps({"intervals": [record]}).encode())
    assert checked.ignored == [] and len(checked.records) == 1


def test_observe_batch_refuses_clips_it_cannot_count_by_name():
    from packscope.agent import Agent, AgentConfig

    text_only = Agent(AgentConfig(log_every=1, count_syncs=False), model=_model(None))
    text_only.step_begin()
    with pytest.raises(ValueError, match="no audio tower"):
        text_only.observe_batch(shape=(1, 8), feature_attention_mask=mask([30]))
    gemma = Agent(AgentConfig(log_every=1, count_syncs=False), model=_model(GEMMA4[(12, 13, 0)]))
    gemma.step_begin()
    with pytest.raises(ValueError, match="feature_attention_mask is not how a gemma4 audio tower's clips come"):
        gemma.observe_batch(shape=(1, 8), feature_attention_mask=mask([30]))


def test_the_callback_counts_clips_only_where_the_model_runs_its_tower():
    """transformers runs the audio tower only given input_features: a mask alone is not counted."""
    from packscope.agent.integrations.batches import audio_kwargs

    audio = GEMMA4[(12, 13, 0)]
    clips = {"input_features_mask": mask([30], None, torch.bool)}
    assert audio_kwargs(clips, audio) == {}
    assert set(audio_kwargs({**clips, "input_features": torch.zeros(1, 30, 8)}, audio)) == {"input_features_mask"}
    assert audio_kwargs({**clips, "input_features": torch.zeros(1, 30, 8)}, None) == {}


def test_a_steps_clips_run_no_op_until_the_boundary():
    """observe_batch keeps each mask by reference: no ATen op between boundaries, one chain for the
    interval's calls at its boundary, not one per call."""
    from packscope.agent import Agent, AgentConfig
    from tests.agent.test_deferred_forms import CountOps

    masks = {name: [mask([250, 70]), mask([1650, 90, 30]), mask([401])] for name in ("few", "many")}
    masks["many"] = masks["many"] * 4
    boundary = {}
    for name, calls in masks.items():
        agent = Agent(AgentConfig(log_every=2, count_syncs=False), model=_model(OMNI[800]))
        counted = []
        for _ in (1, 2):
            with CountOps() as ops:
                agent.step_begin()
                for call in calls:
                    agent.observe_batch(shape=(1, 16), feature_attention_mask=call)
                agent.step_end()
            counted.append(len(ops.ops))
        agent.close()
        assert counted[0] == 0, counted  # nothing before the boundary
        boundary[name] = counted[1]
    extra = 2 * (len(masks["many"]) - len(masks["few"]))  # calls of the interval's two steps
    assert boundary["many"] == boundary["few"] + extra, boundary  # each call: its mask's row sum alone
