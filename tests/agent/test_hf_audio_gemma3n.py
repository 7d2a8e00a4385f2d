"""Gemma 3n's audio tower (packscope.agent.hf_audio_gemma4.gemma3n_audio_tower, the gemma3n tower of
packscope.core.audio_gemma4) against an independent check: what transformers' own
Gemma3nAudioEncoder and embed_audio compute on clips, counted by torch's FlopCounterMode module by
module (tests/core/audio_gemma3n_meta.py), never packscope's formula.

The tower and embed_audio are built alone, without timm: the wrapper (model_type gemma3n) also
builds its vision tower through timm; counted whole in test_gemma3n.py (in .venv-timm)."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from packscope.agent.hf_audio_gemma4 import gemma3n_audio_tower  # noqa: E402
from packscope.core.audio_gemma4 import AUDIO_TOKENS, Gemma4AudioSpec, batch_sums, call_sums  # noqa: E402
from packscope.core.audio_sums import audio_spec_from_dict, c_totals  # noqa: E402
from packscope.core.hf_fields import HFConfigError  # noqa: E402
from tests.agent.structural_configs import STRUCTURAL  # noqa: E402
from tests.core import audio_gemma3n_meta as gm  # noqa: E402

SMALL = {
    "hidden_size": 32,
    "conf_num_attention_heads": 4,
    "conf_num_hidden_layers": 2,
    "sscp_conv_channel_size": [8, 4],
    "input_feat_size": 16,
}
# Blocks of 4 seeing 2 ahead (4 + 2 + 2 slots, 5 relative positions), the output thinned 3 to 1;
# blocks of 6 over 6 + 2 + 1 slots: 4 relative positions (left + right), where Gemma 4's tower would
# project context // 2 + 1 = 5; and the published blocks (12 over 24 slots, 13 positions), thinned 4 to 1.
CONFIGS = {
    "ahead": {**SMALL, "conf_attention_chunk_size": 4, "conf_attention_context_left": 3,
              "conf_attention_context_right": 2, "conf_conv_kernel_size": 3, "conf_reduction_factor": 3},
    "odd_context": {**SMALL, "conf_attention_chunk_size": 6, "conf_attention_context_left": 3,
                    "conf_attention_context_right": 1, "conf_reduction_factor": 1},
    "published_blocks": SMALL,
}  # fmt: skip
# Micro-batches of clips in mel frames, with the call's padded length where the feature extractor
# left more frames than the longest clip.
CLIPS = [([1], None), ([7], None), ([61, 20], None), ([100, 99, 3], None), ([250, 37], 256), ([401], None)]


def text_config():
    from transformers import Gemma3nTextConfig

    return Gemma3nTextConfig(**{k: v for k, v in STRUCTURAL["gemma3n_text"].items() if k != "model_type"})


def build(cfg: dict, device: str = "cpu") -> tuple[nn.Module, nn.Module]:
    from transformers import Gemma3nAudioConfig
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nAudioEncoder, Gemma3nMultimodalEmbedder

    audio = Gemma3nAudioConfig(**cfg)
    torch.manual_seed(0)
    with torch.device(device):
        return Gemma3nAudioEncoder(audio), Gemma3nMultimodalEmbedder(audio, text_config())


@functools.cache
def cpu_modules(name: str) -> tuple[nn.Module, nn.Module]:
    return build(CONFIGS[name])


def spec(name: str) -> Gemma4AudioSpec:
    return gemma3n_audio_tower("gemma3n", *cpu_modules(name))


@pytest.mark.parametrize("clips, padded", CLIPS, ids=[f"{'-'.join(map(str, c))}-to-{p or max(c)}" for c, p in CLIPS])
@pytest.mark.parametrize("name", CONFIGS)
def test_audio_flops_per_component_are_what_the_tower_computes(name, clips, padded):
    audio = spec(name)
    tally, (out, features) = gm.run_audio(*cpu_modules(name), gm.clip_inputs(clips, audio.mel_bins, padded))
    sums = call_sums(audio, clips, padded)
    assert audio.flops_by_component(sums) == gm.measured_flops(tally)
    # the tokens: every row's kept positions, what embed_audio projects and the placeholders take
    assert features.shape[0] * features.shape[1] == sums[AUDIO_TOKENS]
    assert out.last_hidden_state.shape[1] == -(-sums["audio_positions"] // len(clips) // audio.reduction)


def test_the_relative_positions_are_left_plus_right_not_gemma4s():
    audio = spec("odd_context")
    tower, _ = cpu_modules("odd_context")
    assert (audio.context, audio.rel_positions) == (9, 4) and audio.context // 2 + 1 == 5
    rel = tower.conformer[0].attention.attn.relative_position_embedding
    assert rel.max_backward + rel.max_forward + 1 == audio.rel_positions


@pytest.mark.parametrize("name", CONFIGS)
def test_every_gemm_runs_its_backward(name):
    """Every GEMM's output receives a gradient; the attention's matmuls run both gradients, and so
    does every Linear but pos_proj, whose input (the sinusoidal positions) needs none, and the first
    convolution, whose input (the features) needs none: the 6-per-multiply-add convention counts
    both input gradients (as for Gemma 4's tower)."""
    audio = spec(name)
    tally, _ = gm.run_audio(*cpu_modules(name), gm.clip_inputs([61, 20], audio.mel_bins))
    assert tally.gemms and tally.got_gradient == tally.gemms
    forward, backward = gm.op_totals(tally.forward["Global"]), gm.op_totals(tally.backward)
    assert backward["bmm"] == 2 * forward["bmm"]
    pos = sum(v for n, ops in tally.forward.items() if n.endswith("pos_proj") for v in ops.values())
    assert pos == 2 * audio.layers * audio.rel_positions * audio.hidden**2
    assert backward["mm"] == 2 * forward["mm"] - pos


def test_sums_add_across_micro_batches_but_each_call_pads_to_its_own_longest():
    audio = spec("published_blocks")
    apart, together = batch_sums(audio, [[30], [250]]), call_sums(audio, [30, 250])
    assert apart["audio_positions"] == 8 + 63 and together["audio_positions"] == 2 * 63
    assert apart["audio_tokens"] == 2 + 16 and together["audio_tokens"] == 2 * 16  # ⌈8 / 4⌉, ⌈63 / 4⌉
    assert (apart["audio_calls"], together["audio_calls"]) == (2, 1)


def test_the_padding_token_is_priced_once_a_call():
    audio = spec("published_blocks")
    c = audio.c_by_sum
    per_token = 6 * audio.hidden * text_config().hidden_size
    assert c["audio_tokens"]["projector"] == c["audio_calls"]["projector"] == per_token
    assert c["audio_positions"]["projector"] == 0
    assert c_totals(audio)["audio_tokens"] == per_token


def test_the_wire_dict_carries_the_reduction_and_gemma4s_is_unchanged():
    audio = spec("ahead")
    wire = audio.to_dict()
    assert wire["tower"] == "gemma3n" and wire["reduction"] == 3
    assert audio_spec_from_dict(wire) == audio
    gemma4 = Gemma4AudioSpec(**{**{k: v for k, v in wire.items() if k != "reduction"}, "tower": "gemma4"})
    assert "reduction" not in gemma4.to_dict()
    with pytest.raises(ValueError, match="reduction is Gemma 3n's"):
        Gemma4AudioSpec(**{**wire, "tower": "gemma4"})


def test_the_device_sums_are_the_reference():
    from packscope.agent.audio import gemma4_sums, lengths_of

    audio = spec("ahead")
    calls = [([250, 37], 256), ([61, 20, 7], 61)]
    inputs = [gm.clip_inputs(c, audio.mel_bins, p)["input_features_mask"] for c, p in calls]
    got = gemma4_sums(audio, [(lengths_of("input_features_mask", m), int(m.shape[1])) for m in inputs])
    want = dict.fromkeys(got, 0)
    for clips, padded in calls:
        for k, v in call_sums(audio, clips, padded).items():
            want[k] += v
    assert {k: int(v) for k, v in got.items()} == want


def test_a_gemm_the_walk_does_not_place_is_refused():
    tower, embed = build(CONFIGS["ahead"], "meta")
    gemma3n_audio_tower("gemma3n", tower, embed)  # as built: every GEMM placed
    with torch.device("meta"):
        tower.conformer[1].lconv1d.extra = nn.Linear(32, 32)
    with pytest.raises(HFConfigError, match="block 1's GEMMs are not"):
        gemma3n_audio_tower("gemma3n", tower, embed)
    del tower.conformer[1].lconv1d.extra
    with torch.device("meta"):
        tower.head = nn.Linear(32, 32)
    with pytest.raises(HFConfigError, match=r"its module 'head' \(Linear\) is not placed"):
        gemma3n_audio_tower("gemma3n", tower, embed)
    del tower.head
    with torch.device("meta"):
        embed.extra = nn.Linear(24, 24)
    with pytest.raises(HFConfigError, match="embed_audio is not one projection"):
        gemma3n_audio_tower("gemma3n", tower, embed)


@pytest.mark.parametrize(
    "change",
    [{"sscp_conv_kernel_size": [[3, 3], [5, 3]]}, {"sscp_conv_stride_size": [[2, 2], [1, 2]]}],
    ids=["kernel", "stride"],
)
def test_a_subsampling_the_formula_does_not_price_is_refused(change):
    tower, embed = build({**CONFIGS["ahead"], **change}, "meta")
    with pytest.raises(HFConfigError, match=r"its conv_1.conv is not a 3 x 3, stride-2 convolution") as caught:
        gemma3n_audio_tower("gemma3n", tower, embed)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("clips", [[3000, 1000], [3000], [1000, 50]], ids=lambda c: "-".join(map(str, c)))
def test_the_published_tower_on_the_meta_device_per_component(clips):
    """transformers' default Gemma3nAudioConfig (the published widths: 12 blocks of 1536, 128 mel
    bins) and a 2048-wide decoder, forward on the meta device: shapes only; every component exact."""
    from transformers import Gemma3nAudioConfig, Gemma3nTextConfig
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nAudioEncoder, Gemma3nMultimodalEmbedder

    with torch.device("meta"):
        config = Gemma3nAudioConfig()
        tower, embed = Gemma3nAudioEncoder(config), Gemma3nMultimodalEmbedder(config, Gemma3nTextConfig())
    audio = gemma3n_audio_tower("gemma3n", tower, embed)
    assert (audio.layers, audio.hidden, audio.mel_bins, audio.rel_positions, audio.reduction) == (12, 1536, 128, 13, 4)
    inputs = {k: v.to("meta") for k, v in gm.clip_inputs(clips, audio.mel_bins).items()}
    with torch.no_grad(), gm.FlopCounterMode(display=False) as counter:
        out = tower(inputs["input_features"], ~inputs["input_features_mask"], return_dict=True)
        embed(inputs_embeds=out.last_hidden_state)
        embed(input_ids=torch.tensor([[embed.vocab_offset + embed.vocab_size - 1]], device="meta"))
    counts = {k: dict(v) for k, v in counter.get_flop_counts().items()}
    gemms = {
        f"{root}.{n}"
        for root, module in ((gm.TOWER, tower), (gm.EMBED, embed))
        for n, m in module.named_modules()
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))
    }
    tally = gm.Tally(forward=counts, gemms=gemms)
    assert audio.flops_by_component(call_sums(audio, clips)) == gm.measured_flops(tally)
    if max(clips) == 3000:  # 30 s: 750 positions kept 1 in 4, the processor's 188 audio soft tokens
        assert out.last_hidden_state.shape[1] == 188
