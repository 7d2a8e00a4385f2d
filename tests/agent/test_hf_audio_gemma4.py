"""Gemma 4's audio tower (packscope.agent.hf_audio_gemma4, packscope.core.audio_gemma4) against an
independent check: what transformers' own tower and embed_audio compute on clips, counted by torch's
FlopCounterMode module by module (tests/core/audio_gemma4_meta.py), never packscope's formula.
The decoder and the vision tower beside it are held to theirs in test_hf_structure.py and
test_hf_towers.py (WRAPPERS["gemma4"])."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from packscope.agent.hf_audio_gemma4 import gemma4_audio_tower  # noqa: E402
from packscope.agent.hf_structure import spec_from_structure  # noqa: E402
from packscope.core.audio_gemma4 import AUDIO_TOKENS, Gemma4AudioSpec, batch_sums, call_sums  # noqa: E402
from packscope.core.flops import ModelSpec  # noqa: E402
from packscope.core.hf_fields import HFConfigError  # noqa: E402
from tests.agent.audio_callback import check_all_three_agree  # noqa: E402
from tests.agent.structural_configs import GEMMA4_AUDIO, WRAPPERS  # noqa: E402
from tests.core import audio_gemma4_meta as gm  # noqa: E402
from tests.core import hf_meta as hf  # noqa: E402

ROOT = Path(__file__).parents[2]
WITH_VISION = {**WRAPPERS["gemma4"], "audio_config": GEMMA4_AUDIO}
# Small blocks that see ahead (blocks of 4 over 4 + 2 + 2 slots), on 12 mel bins (16 // 4 = 4 channels
# would need 16; 12 channels leave 3 bins of 12), without the vision tower.
SMALL_BLOCKS = {
    **{k: v for k, v in WRAPPERS["gemma4"].items() if k != "vision_config"},
    "audio_config": {
        **GEMMA4_AUDIO,
        "subsampling_conv_channels": [12, 4],
        "attention_chunk_size": 4,
        "attention_context_left": 3,
        "attention_context_right": 2,
        "conv_kernel_size": 3,
    },
}
CONFIGS = {"with_vision": WITH_VISION, "small_blocks": SMALL_BLOCKS}
# Micro-batches of clips in mel frames (100 a second), with the call's padded length where the
# feature extractor left more frames than the longest clip: one frame; clips of one, two and many
# blocks; a short clip beside a long one (padded to it); odd lengths that the halvings round up.
CLIPS = [([1], None), ([7], None), ([61, 20], None), ([100, 99, 3], None), ([250, 37], 256), ([401], None)]


@functools.cache
def cpu_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return hf.build(hf.config_from_dict(CONFIGS[name]), "cpu")


def spec(name: str) -> Gemma4AudioSpec:
    audio = spec_from_structure(CONFIGS[name]).audio
    assert isinstance(audio, Gemma4AudioSpec)
    return audio


@pytest.mark.parametrize("clips, padded", CLIPS, ids=[f"{'-'.join(map(str, c))}-to-{p or max(c)}" for c, p in CLIPS])
@pytest.mark.parametrize("name", CONFIGS)
def test_audio_flops_per_component_are_what_the_tower_computes(name, clips, padded):
    audio = spec(name)
    tally, out = gm.run_audio(cpu_model(name), gm.clip_inputs(clips, audio.mel_bins, padded))
    sums = call_sums(audio, clips, padded)
    assert audio.flops_by_component(sums) == gm.measured_flops(tally)
    # the tokens the decoder's audio placeholders take: the valid positions the tower keeps
    assert int(out.attention_mask.sum()) == sums[AUDIO_TOKENS]
    assert out.pooler_output.shape[:2] == (len(clips), sums["audio_positions"] // len(clips))


@pytest.mark.parametrize("name", CONFIGS)
def test_every_gemm_runs_its_backward(name):
    """Every GEMM's output receives a gradient, padded positions included (the embedded features are
    indexed by the mask afterwards, whose backward is dense); the attention's matmuls run both
    gradients, and so does every Linear but relative_k_proj, whose input (the sinusoidal positions)
    needs none: the 6-per-multiply-add convention counts that one input gradient, and the first
    convolution's, which autograd skips (docs/flops.md, "Gemma 4's audio tower")."""
    audio = spec(name)
    tally, _ = gm.run_audio(cpu_model(name), gm.clip_inputs([61, 20], audio.mel_bins))
    assert tally.gemms and tally.got_gradient == tally.gemms
    forward, backward = gm.op_totals(tally.forward["Global"]), gm.op_totals(tally.backward)
    assert backward["bmm"] == 2 * forward["bmm"]
    rel_k = sum(v for n, ops in tally.forward.items() if n.endswith("relative_k_proj") for v in ops.values())
    assert rel_k == 2 * audio.layers * audio.rel_positions * audio.hidden**2
    assert backward["mm"] == 2 * forward["mm"] - rel_k


def test_the_blocks_are_the_towers_own():
    """401 frames: 201 after the first convolution, 101 positions, 9 blocks of 12 (the last padded
    from 5), each over 24 slots, with 13 relative positions."""
    audio = spec("with_vision")
    assert (audio.context, audio.rel_positions, audio.mel_bins) == (24, 13, 8)
    sums = call_sums(audio, [401])
    assert (sums["audio_conv1_frames"], sums["audio_positions"], sums["audio_blocks"]) == (201, 101, 9)
    tower = cpu_model("with_vision").model.audio_tower
    assert tower.layers[0].self_attn.context_size == audio.context
    assert tower.rel_pos_enc(torch.zeros(1)).shape[-2] == audio.rel_positions


def test_sums_add_across_micro_batches_but_each_call_pads_to_its_own_longest():
    audio = spec("with_vision")
    apart, together = batch_sums(audio, [[30], [250]]), call_sums(audio, [30, 250])
    assert apart["audio_tokens"] == together["audio_tokens"] == 8 + 63
    assert apart["audio_positions"] == 8 + 63 and together["audio_positions"] == 2 * 63
    assert (apart["audio_calls"], together["audio_calls"]) == (2, 1)
    with pytest.raises(ValueError, match="padded length"):
        call_sums(audio, [30, 250], padded=200)


def test_the_feature_extractor_can_pad_a_call_a_frame_past_its_longest_clip():
    """It pads the waveform to a multiple of 128 samples: 16133 samples give 100 valid frames of 101,
    and the tower runs on 101 (the padded= of call_sums; the CLI takes the longest clip)."""
    import numpy as np
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

    out = Gemma4AudioFeatureExtractor()([np.full(16133, 0.1, dtype=np.float32)], sampling_rate=16000)
    frames, valid = len(out["input_features"][0]), int(np.sum(out["input_features_mask"][0]))
    assert (frames, valid) == (101, 100)
    audio = spec("with_vision")
    padded, longest = call_sums(audio, [valid], padded=frames), call_sums(audio, [valid])
    assert (padded["audio_conv1_frames"], longest["audio_conv1_frames"]) == (51, 50)


def test_the_audio_tower_is_counted_not_left_out():
    spec = spec_from_structure(WITH_VISION)
    assert spec.audio is not None and not any("audio" in note for note in spec.not_counted)


def test_without_a_vision_config_the_audio_tower_is_still_counted():
    model = spec_from_structure(SMALL_BLOCKS)
    assert model.vision is None and isinstance(model.audio, Gemma4AudioSpec)
    assert model.measured == spec_from_structure(WITH_VISION).measured  # the decoder alone, as with vision


def test_the_wire_dict_carries_the_audio_tower():
    model = spec_from_structure(WITH_VISION)
    wire = json.loads(json.dumps(model.to_dict()))
    assert wire["audio"]["tower"] == "gemma4"
    back = ModelSpec.from_dict(wire)
    assert back == model and isinstance(back.audio, Gemma4AudioSpec) and back.audio == model.audio


def test_a_gemm_the_audio_walk_does_not_place_is_refused():
    built = hf.build(hf.config_from_dict(WITH_VISION), "meta").model
    tower, embed = built.audio_tower, built.embed_audio
    gemma4_audio_tower("gemma4", tower, embed)  # as built: every GEMM placed
    with torch.device("meta"):
        tower.layers[1].lconv1d.extra = nn.Linear(16, 16)
    with pytest.raises(HFConfigError, match="layer 1's GEMMs are not"):
        gemma4_audio_tower("gemma4", tower, embed)
    del tower.layers[1].lconv1d.extra
    with torch.device("meta"):
        tower.head = nn.Linear(16, 16)
    with pytest.raises(HFConfigError, match=r"its module 'head' \(Linear\) is not placed"):
        gemma4_audio_tower("gemma4", tower, embed)
    del tower.head
    with torch.device("meta"):
        embed.extra = nn.Linear(24, 24)
    with pytest.raises(HFConfigError, match="embed_audio is not one projection"):
        gemma4_audio_tower("gemma4", tower, embed)
    del embed.extra
    with torch.device("meta"):
        tower.subsample_conv_projection.layer1.conv = nn.Conv2d(8, 4, 3, 1, padding=1)
    with pytest.raises(HFConfigError, match=r"its layer1.conv is not a 3 x 3, stride-2 convolution") as caught:
        gemma4_audio_tower("gemma4", tower, embed)
    assert "\n" not in str(caught.value)


def test_the_mel_width_is_what_input_proj_linear_reads():
    """The config holds no mel width; transformers sizes input_proj_linear C0 // 4 x C1 (a 128-bin
    extractor's 32 bins left of the published C0 = 128). C0 = 6 gives 1 x 4 values: one bin left,
    so 4 mel bins (4 · 1, as the published 128 = 4 · 32), and the tower runs on them as counted."""
    cfg = {**SMALL_BLOCKS, "audio_config": {**GEMMA4_AUDIO, "subsampling_conv_channels": [6, 4]}}
    audio = spec_from_structure(cfg).audio
    assert isinstance(audio, Gemma4AudioSpec) and (audio.mel_bins, audio.input_proj_inputs) == (4, 4)
    torch.manual_seed(0)
    tally, _ = gm.run_audio(hf.build(hf.config_from_dict(cfg), "cpu"), gm.clip_inputs([61, 20], 4))
    assert audio.flops_by_component(call_sums(audio, [61, 20])) == gm.measured_flops(tally)


# -- the calculator, the Python API and the callback ---------------------------------------------


def test_the_cli_prices_the_clips_as_the_api(tmp_path, capsys):
    from packscope.agent import spec_from_any_hf_config
    from packscope.commands.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(WITH_VISION))
    calls = [[250, 70], [30]]
    base = ["flops", "--hf-config", str(path), "--pack", "10,6", "--pack-length", "16"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*base, *(a for c in calls for a in ("--audio", ",".join(map(str, c))))]) == 0
    cli = json.loads(capsys.readouterr().out)
    model = spec_from_any_hf_config(hf.config_from_dict(WITH_VISION))
    assert isinstance(model.audio, Gemma4AudioSpec)
    assert cli["audio"]["tower"] == "gemma4"
    assert cli["audio"]["sums"] == batch_sums(model.audio, calls)
    assert cli["audio"]["decoder_tokens"] == 63 + 18 + 8
    assert cli["audio"]["flops"] == model.audio.flops(batch_sums(model.audio, calls)) > 0
    assert cli["audio"]["in_totals"] is True  # added to every view, as the record adds it
    views = ("flops_bshd", "flops_thd", "flops_useful")
    assert {k: cli[k] for k in views} == {k: plain[k] + cli["audio"]["flops"] for k in views}


@pytest.mark.parametrize("name", CONFIGS)
def test_the_hf_callbacks_record_is_the_cli_and_the_api_to_the_integer(name, tmp_path, capsys, caplog):
    """Three micro-batches of one step, two with clips (each padded to its longest, its mask as the
    feature extractor writes it) and one without: the record carries the tower's sums, and its
    FLOPs are `packscope flops --audio` and the API's in every view; nothing is warned."""
    calls = [[250, 70], [401, 61, 7]]
    model = spec_from_structure(CONFIGS[name])
    assert model.audio is not None
    inputs = [gm.clip_inputs(c, model.audio.mel_bins) for c in calls]
    with caplog.at_level("WARNING", logger="packscope.agent"):
        record = check_all_three_agree(model, CONFIGS[name], [*inputs, {}], [*calls, []], tmp_path, capsys)
    assert record["audio_blocks"] > 0 and record["audio_calls"] == 2 and record["audio_clips"] == 5
    assert not caplog.records


def test_the_callback_counts_a_call_at_its_padded_length():
    """The feature extractor can pad a call past its longest clip: the tower runs on every frame of
    input_features, and the record counts them (the reference's padded=)."""
    from tests.agent.audio_callback import callback_record

    model = spec_from_structure(WITH_VISION)
    audio = model.audio
    assert isinstance(audio, Gemma4AudioSpec)
    record = callback_record(model, [gm.clip_inputs([250, 37], audio.mel_bins, 256)])
    want = call_sums(audio, [250, 37], 256)
    assert {name: record[name] for name in want} == want


# -- the published widths and the worked value of docs/flops.md ----------------------------------

FIXTURE = ROOT / "tests" / "fixtures" / "hf" / "structural" / "gemma4_audio.json"
WORKED_CLIPS = [[3000, 1000], [3000], [1000, 50]]  # 30 s and 10 s together, 30 s alone, 10 s and 0.5 s


def published() -> Gemma4AudioSpec:
    audio = spec_from_structure(json.loads(FIXTURE.read_text())).audio
    assert isinstance(audio, Gemma4AudioSpec)
    return audio


class _AudioOnly(nn.Module):
    """The wrapper's audio path alone (its own get_audio_features), without the decoder."""

    def __init__(self, config) -> None:
        from transformers.models.gemma4.modeling_gemma4 import Gemma4AudioModel, Gemma4MultimodalEmbedder

        super().__init__()
        self.audio_tower = Gemma4AudioModel._from_config(config.audio_config)
        self.embed_audio = Gemma4MultimodalEmbedder(config.audio_config, config.text_config)

    def get_audio_features(self, **inputs):
        from transformers.models.gemma4.modeling_gemma4 import Gemma4Model

        return Gemma4Model.get_audio_features(self, **inputs)


@pytest.mark.parametrize("clips", WORKED_CLIPS, ids=lambda c: "-".join(map(str, c)))
def test_the_published_tower_on_the_meta_device_per_component(clips):
    """transformers' default tower (the worked value's widths), forward on the meta device: shapes
    only, so the page's clips at full width cost nothing; every component exact."""
    audio = published()
    with torch.device("meta"):
        model = _AudioOnly(hf.config_from_dict(json.loads(FIXTURE.read_text())))
    inputs = {k: v.to("meta") for k, v in gm.clip_inputs(clips, audio.mel_bins).items()}
    tally, _ = gm.run_audio(model, inputs, backward=False)
    assert audio.flops_by_component(call_sums(audio, clips)) == gm.measured_flops(tally)


def worked_rows() -> str:
    """The page's table, from the code: one micro-batch a row."""
    audio = published()
    lines = []
    for clips in WORKED_CLIPS:
        sums = call_sums(audio, clips)
        parts = audio.flops_by_component(sums)
        counts = " | ".join(str(sums[k]) for k in ("audio_conv1_frames", "audio_positions", "audio_blocks"))
        lines.append(
            f"| {', '.join(map(str, clips))} | {counts} | {sums['audio_tokens']} | "
            + " | ".join(f"{parts[k]:.6e}" for k in ("conv", "attention", "lconv", "mlp", "projector", "core_chunked"))
            + f" | {audio.flops(sums):.6e} |"
        )
    return "\n".join(lines)


def test_the_pages_worked_audio_values_are_the_codes():
    doc = (ROOT / "docs" / "flops.md").read_text()
    table = doc.split("<!-- gemma4-audio:start -->\n")[1].split("<!-- gemma4-audio:end -->")[0]
    assert worked_rows() in table, worked_rows()


def test_the_pages_hand_coefficients_are_the_codes():
    """The per-position coefficients the page works out by hand (d = 1024, 12 layers, ffn 4096)."""
    c = published().c_by_sum
    d, n = 1024, 12
    assert c["audio_positions"]["mlp"] == 6 * n * 4 * d * 4096 == 1207959552
    assert c["audio_positions"]["lconv"] == 6 * n * (3 * d * d + 5 * d) == 226861056
    assert c["audio_blocks"]["core_chunked"] == 6 * n * 12 * d * (2 * 24 + 13) == 53968896
    assert c["audio_calls"]["attention"] == 6 * n * 13 * d * d == 981467136


def test_the_pages_command_gives_the_pages_figures(capsys):
    from packscope.commands.cli import main

    doc = (ROOT / "docs" / "flops.md").read_text()
    args = ["--hf-config", str(FIXTURE), "--pack", "1000", "--audio", "3000,1000", "--audio", "3000"]
    assert main(["flops", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    assert f'"audio": {{"flops": {out["audio"]["flops"]}, ...}}' in doc.split("<!-- gemma4-audio:end -->")[1]


# -- the Trainer's own batches ----------------------------------------------------------------------


class WithClips:
    """Each example one padded row opened by a clip's audio placeholders (g²(n) of a clip of n
    frames, what the tower hands the decoder), its clip padded to the batch's longest in
    input_features, with the mask the feature extractor writes. Keeps the clips of every batch."""

    audio = 63  # the placeholder's id: the tiny vocabulary's last

    def __init__(self, mel_bins: int) -> None:
        self.mel_bins = mel_bins
        self.calls: list[list[int]] = []

    def __call__(self, features):
        g = lambda x: (x - 1) // 2 + 1  # noqa: E731
        clips = [20 + 37 * len(f["input_ids"]) % 300 for f in features]
        rows = [
            [self.audio] * g(g(n)) + [min(t, self.audio - 1) for t in f["input_ids"]]
            for n, f in zip(clips, features, strict=True)
        ]
        width = max(map(len, rows))
        self.calls.append(clips)
        return {
            "input_ids": torch.tensor([r + [0] * (width - len(r)) for r in rows]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
            "labels": torch.tensor(
                [[-100 if t == self.audio else t for t in r] + [-100] * (width - len(r)) for r in rows]
            ),
            **gm.clip_inputs(clips, self.mel_bins),
        }


def test_the_trainers_batches_are_counted_with_their_clips():
    """A tiny Gemma 4 with an audio tower trained by the Trainer: the forward hook keeps each
    micro-batch's input_features as its shape (meta) and its mask by reference; each record holds
    the reference sums of its interval's calls, and its FLOPs are the decoder's on its token sums
    plus the tower's, in every view."""
    import dataclasses

    import transformers

    from packscope.agent.integrations.hf import PackscopeCallback
    from packscope.core.attention import SUM_NAMES as ATTENTION_SUM_NAMES
    from tests.agent.structural_configs import STRUCTURAL

    vocab = WithClips.audio + 1
    text = {**STRUCTURAL["gemma4_text"], "pad_token_id": 0, "vocab_size": vocab, "vocab_size_per_layer_input": vocab}
    cfg = {"model_type": "gemma4", "text_config": text, "audio_config": GEMMA4_AUDIO, "audio_token_id": WithClips.audio}
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(hf.config_from_dict(cfg))
    spec = spec_from_structure(cfg)
    assert isinstance(spec.audio, Gemma4AudioSpec)
    collator = WithClips(spec.audio.mel_bins)
    cb = PackscopeCallback(run_name="hf-audio", log_every=2, check_cross_documents=False)
    kept: list[str] = []
    observe = cb._pending._observe_step

    def observe_step(forwards):
        kept.extend(kwargs["input_features"].device.type for _, kwargs, _ in forwards)
        observe(forwards)

    cb._pending._observe_step = observe_step
    g = torch.Generator().manual_seed(1)
    data = [
        {"input_ids": torch.randint(3, 40, (int(k),), generator=g).tolist()}
        for k in torch.randint(2, 12, (16,), generator=g)
    ]
    args = transformers.TrainingArguments(
        output_dir="hf-test", per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=4,
        logging_steps=2, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
        remove_unused_columns=False,
    )  # fmt: skip
    transformers.Trainer(model=model, args=args, data_collator=collator, callbacks=[cb], train_dataset=data).train()
    assert kept == ["meta"] * 8  # 4 steps of 2 micro-batches, none holding its features past its step
    records = list(cb.agent.records)
    assert len(records) == 2 and cb.agent.model == spec
    decoder = dataclasses.replace(spec, audio=None)
    for i, record in enumerate(records):
        want = batch_sums(spec.audio, collator.calls[i * 4 : (i + 1) * 4])
        assert {name: record[name] for name in want} == want
        sums = {name: record[name] for name in ATTENTION_SUM_NAMES}
        flops = decoder.triad_by_kind(record["tokens"], record["real_tokens"], sums)
        tower = spec.audio.flops(want)
        assert {v: record[f"flops_{v}"] for v in flops} == {v: float(f + tower) for v, f in flops.items()}
