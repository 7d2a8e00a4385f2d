"""Qwen3-Omni's audio tower (packscope.agent.hf_audio, packscope.core.audio)
against an independent check: what transformers' own tower computes on clips, forward and backward
on the CPU (tests/core/audio_meta.py: the GEMMs that received a gradient, by component, padding
included, and the (query, key) pairs of every attention call the tower makes), never packscope's
formula. The thinker's vision tower and decoder are held to theirs in test_hf_towers.py and
test_hf_structure.py (WRAPPERS["qwen3_omni_moe_thinker"])."""

from __future__ import annotations

import functools
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from packscope.agent.hf_audio import audio_tower  # noqa: E402
from packscope.agent.hf_structure import spec_from_any_hf_dict, spec_from_structure  # noqa: E402
from packscope.core.audio import AUDIO_TOKENS, AudioSpec, batch_sums, call_sums  # noqa: E402
from packscope.core.flops import ModelSpec  # noqa: E402
from packscope.core.hf_fields import HFConfigError  # noqa: E402
from tests.agent.audio_callback import check_all_three_agree  # noqa: E402
from tests.agent.structural_configs import OMNI_AUDIO, WRAPPERS  # noqa: E402
from tests.core import audio_meta as am  # noqa: E402
from tests.core import hf_meta as hf  # noqa: E402

THINKER = WRAPPERS["qwen3_omni_moe_thinker"]
# The same thinker with the published attention window (n_window_infer 800: 8 chunks, 104 tokens).
PUBLISHED_WINDOW = {**THINKER, "audio_config": {**OMNI_AUDIO, "n_window_infer": 800}}
CONFIGS = {"thinker": THINKER, "published_window": PUBLISHED_WINDOW}
# Micro-batches of clips, in mel frames: short clips alone (every chunk padded to the longest tail,
# the window shrinking with it), a full chunk exactly, clips of several chunks with tails beside a
# short one, and clips long enough to fill several attention windows of either config.
CLIPS = [[30], [64, 30], [100], [250, 70], [120, 437, 9], [800, 801], [1650, 90]]


@functools.cache
def cpu_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return hf.build(hf.config_from_dict(CONFIGS[name]), "cpu")


@pytest.mark.parametrize("clips", CLIPS, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("name", CONFIGS)
def test_audio_flops_per_component_are_what_the_tower_computes(name, clips):
    audio = spec_from_structure(CONFIGS[name]).audio
    assert audio is not None
    tally, feats = am.run_audio(cpu_model(name), am.clip_inputs(clips, audio.mel_bins))
    sums = call_sums(audio, clips)
    assert audio.flops_by_component(sums) == am.measured_flops(tally)
    assert not any(tally.forward_only_macs.values())  # every GEMM that ran is model work
    assert feats.shape[0] == sums[AUDIO_TOKENS]  # the tokens the decoder's audio placeholders take


def test_the_windows_are_the_towers_own():
    """A clip of 1650 frames is 16 full chunks and a tail of 50: 16 · 13 + 7 = 215 tokens, in windows
    of 104 (8 chunks of 13) under the published n_window_infer, 26 under the tiny one."""
    tally, _ = am.run_audio(cpu_model("published_window"), am.clip_inputs([1650], OMNI_AUDIO["num_mel_bins"]))
    layers = OMNI_AUDIO["encoder_layers"]
    assert tally.calls == [(104, 104), (104, 104), (7, 7)] * layers
    audio = spec_from_structure(PUBLISHED_WINDOW).audio
    assert audio is not None and call_sums(audio, [1650])["audio_sq_sum"] == 2 * 104**2 + 7**2


def test_sums_add_across_micro_batches_but_each_call_pads_to_its_own_longest():
    """Two calls of 30 and 250 frames pad the short clip to 30; one call of both pads it to 100."""
    audio = spec_from_structure(THINKER).audio
    assert audio is not None
    apart, together = batch_sums(audio, [[30], [250]]), call_sums(audio, [30, 250])
    assert apart["audio_tokens"] == together["audio_tokens"]
    assert apart["audio_conv1_frames"] == 15 + 3 * 50 and together["audio_conv1_frames"] == 4 * 50


# -- the omni model is its thinker -----------------------------------------------------------------


def test_an_omni_model_counts_as_its_thinker():
    """Qwen3OmniMoeForConditionalGeneration has no forward of its own: a fine-tune runs its thinker,
    and the talker and code2wav beside it run in generate() only."""
    from transformers import AutoConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeForConditionalGeneration

    assert "forward" not in vars(Qwen3OmniMoeForConditionalGeneration)
    assert Qwen3OmniMoeForConditionalGeneration.forward is nn.Module.forward  # calling it raises
    thinker = spec_from_structure(THINKER)
    omni = spec_from_structure({"model_type": "qwen3_omni_moe", "thinker_config": THINKER, "enable_audio_output": True})
    assert omni == thinker and omni.audio == thinker.audio and omni.vision == thinker.vision
    assert omni.name == "qwen3_omni_moe (structural: the thinker)"
    # transformers' defaults, talker and code2wav configs included: counted, not refused
    published = spec_from_any_hf_dict(AutoConfig.for_model("qwen3_omni_moe").to_dict())
    assert published.audio is not None and published.vision is not None and published.layers == 28


def test_the_talkers_config_is_not_read_but_the_wrappers_own_keys_are():
    """A key of talker_config the class lacks changes no training work: accepted; one of the
    wrapper's own is refused by name, as for any model."""
    cfg = {"model_type": "qwen3_omni_moe", "thinker_config": THINKER}
    talker = {"model_type": "qwen3_omni_moe_talker", "codec_vocab_size": 64}
    assert spec_from_structure({**cfg, "talker_config": talker}) == spec_from_structure(THINKER)
    with pytest.raises(HFConfigError, match=r"'speaker_embedding_size' is not a field"):
        spec_from_structure({**cfg, "speaker_embedding_size": 8})


def test_the_audio_tower_is_counted_not_left_out():
    spec = spec_from_structure(THINKER)
    assert spec.audio is not None and not any("audio" in note for note in spec.not_counted)


def test_the_wire_dict_carries_the_audio_tower_and_the_server_prices_it():
    """The model dict holds ModelSpec.audio (its `tower` names the class it loads as); the server's
    coefficients price each record sum by its components' total."""
    from packscope.core.catalogue import Coefficients

    spec = spec_from_structure(THINKER)
    assert spec.audio is not None
    wire = json.loads(json.dumps(spec.to_dict()))
    assert wire["audio"] == spec.audio.to_dict() and wire["audio"]["tower"] == "qwen3_omni"
    back = ModelSpec.from_dict(wire)
    assert back == spec and back.audio == spec.audio and isinstance(back.audio, AudioSpec)
    c = dict(Coefficients.for_run(wire, {}).c_audio)
    assert c == {name: sum(parts.values()) for name, parts in spec.audio.c_by_sum.items()}
    with pytest.raises(ValueError, match="'tower' is one of"):
        ModelSpec.from_dict({**wire, "audio": {**wire["audio"], "tower": "whisper"}})


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"model_type": "qwen3_omni_moe"}, r"'thinker_config' is missing"),
        ({"model_type": "qwen3_omni_moe", "thinker_config": {}}, r"'thinker_config' is empty"),
        (
            {"model_type": "qwen3_omni_moe", "thinker_config": {**THINKER, "model_type": "qwen3_vl"}},
            r"'thinker_config.model_type' is 'qwen3_vl'",
        ),
        ({k: v for k, v in THINKER.items() if k != "audio_config"}, r"'audio_config' is missing"),
        ({**THINKER, "audio_config": {**OMNI_AUDIO, "n_window": 40}}, r"n_window 40: a chunk of 80 frames"),
        ({**THINKER, "audio_config": {**OMNI_AUDIO, "n_window_infer": 60}}, r"n_window_infer \(60\) is shorter"),
        ({**THINKER, "audio_config": {**OMNI_AUDIO, "moe_every_other_layer": 1}}, r"'audio_config.moe_every"),
    ],
)
def test_an_omni_config_the_count_cannot_read_is_refused_in_one_line(cfg, message):
    with pytest.raises(HFConfigError, match=message) as caught:
        spec_from_structure(cfg)
    assert "\n" not in str(caught.value)


def test_a_gemm_the_audio_walk_does_not_place_is_refused():
    tower = hf.build(hf.config_from_dict(THINKER), "meta").model.audio_tower
    audio_tower("qwen3_omni_moe_thinker", tower)  # as built: every GEMM placed
    with torch.device("meta"):
        tower.layers[1].extra = nn.Linear(16, 16)
    with pytest.raises(HFConfigError, match="layer 1's GEMMs"):
        audio_tower("qwen3_omni_moe_thinker", tower)
    del tower.layers[1].extra
    with torch.device("meta"):
        tower.head = nn.Linear(16, 16)
    with pytest.raises(HFConfigError, match=r"its module 'head' \(Linear\) is not placed"):
        audio_tower("qwen3_omni_moe_thinker", tower)
    del tower.head
    with torch.device("meta"):
        tower.conv2d2 = nn.Conv2d(4, 4, 3, 1, padding=1)
    with pytest.raises(HFConfigError, match="its conv2d2 is not a 3 x 3, stride-2 convolution"):
        audio_tower("qwen3_omni_moe_thinker", tower)


# -- the calculator, the Python API and the agent's sums agree -------------------------------------


def test_the_cli_prices_the_clips_as_the_api(tmp_path, capsys):
    """`packscope flops --audio` per micro-batch: the reference sums and ModelSpec.audio's FLOPs,
    added to each view's total (the record's: the callback's test below)."""
    from packscope.agent import spec_from_any_hf_config
    from packscope.commands.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(THINKER))
    calls = [[250, 70], [30]]
    base = ["flops", "--hf-config", str(path), "--pack", "10,6", "--pack-length", "16"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*base, *(a for c in calls for a in ("--audio", ",".join(map(str, c))))]) == 0
    cli = json.loads(capsys.readouterr().out)

    model = spec_from_any_hf_config(hf.config_from_dict(THINKER))
    assert model.audio is not None
    assert cli["audio"]["sums"] == batch_sums(model.audio, calls)
    assert cli["audio"]["flops"] == model.audio.flops(batch_sums(model.audio, calls)) > 0
    assert cli["audio"]["in_totals"] is True  # added to every view, as the record adds it
    assert {k: cli[k] for k in ("flops_bshd", "flops_thd", "flops_useful")} == {
        k: plain[k] + cli["audio"]["flops"] for k in ("flops_bshd", "flops_thd", "flops_useful")
    }


def test_the_cli_refuses_clips_for_a_model_without_an_audio_tower(tmp_path, capsys):
    from packscope.commands.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(WRAPPERS["qwen3_vl"]))
    assert main(["flops", "--hf-config", str(path), "--pack", "10", "--audio", "100"]) == 2
    assert "no audio tower" in capsys.readouterr().err


# -- the worked value of docs/flops.md's "Audio towers" ---------------------------------------------

FIXTURE = "qwen3_omni_moe.json"
WORKED_CLIPS = [[3000, 1000], [3000], [1000, 50]]  # 30 s and 10 s together, 30 s alone, 10 s and 0.5 s


def worked_rows() -> str:
    """The page's table, from the code: transformers' default Qwen3-Omni, one micro-batch a row."""
    from pathlib import Path

    root = Path(__file__).parents[2]
    audio = spec_from_structure(
        json.loads((root / "tests" / "fixtures" / "hf" / "structural" / FIXTURE).read_text())
    ).audio
    assert audio is not None
    lines = []
    for clips in WORKED_CLIPS:
        sums = call_sums(audio, clips)
        parts = audio.flops_by_component(sums)
        frames = ", ".join(str(sums[k]) for k in ("audio_conv1_frames", "audio_conv2_frames", "audio_conv3_frames"))
        lines.append(
            f"| {', '.join(map(str, clips))} | {sums['audio_chunks']} | {frames} | {sums['audio_tokens']} "
            f"| {sums['audio_sq_sum']} | "
            + " | ".join(f"{parts[k]:.6e}" for k in ("conv", "attention", "mlp", "projector", "core_full"))
            + f" | {audio.flops(sums):.6e} |"
        )
    return "\n".join(lines)


def test_the_pages_worked_audio_values_are_the_codes():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "flops.md").read_text()
    table = doc.split("<!-- omni-audio:start -->\n")[1].split("<!-- omni-audio:end -->")[0]
    assert worked_rows() in table, worked_rows()


def test_the_pages_command_gives_the_pages_figures(capsys):
    from pathlib import Path

    from packscope.commands.cli import main

    root = Path(__file__).parents[2]
    doc = (root / "docs" / "flops.md").read_text()
    path = root / "tests" / "fixtures" / "hf" / "structural" / FIXTURE
    assert main(["flops", "--hf-config", str(path), "--pack", "1000", "--audio", "3000,1000", "--audio", "3000"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert f'"audio": {{"flops": {out["audio"]["flops"]}, ...}}' in doc
    assert f"`flops_thd`\n{out['flops_thd']}: the decoder's {out['flops_thd'] - out['audio']['flops']} for the" in doc


@pytest.mark.parametrize("name", CONFIGS)
def test_the_hf_callbacks_record_is_the_cli_and_the_api_to_the_integer(name, tmp_path, capsys, caplog):
    """Three micro-batches of one step, two with clips (each padded to its longest, its mask as the
    feature extractor writes it) and one without: the record carries the tower's sums, and its
    FLOPs are `packscope flops --audio` and the API's in every view; nothing is warned."""
    calls = [[250, 70], [1650, 90, 30]]
    model = spec_from_structure(CONFIGS[name])
    inputs = [am.clip_inputs(c, OMNI_AUDIO["num_mel_bins"]) for c in calls]
    with caplog.at_level("WARNING", logger="packscope.agent"):
        record = check_all_three_agree(model, CONFIGS[name], [*inputs, {}], [*calls, []], tmp_path, capsys)
    assert record["audio_sq_sum"] > 0 and record["audio_clips"] == 5
    assert not caplog.records


class _AudioOnly(nn.Module):
    """The thinker's audio path alone (its own get_audio_features), without its 30B-parameter decoder."""

    def __init__(self, config) -> None:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder

        super().__init__()
        self.config = config
        self.audio_tower = Qwen3OmniMoeAudioEncoder._from_config(config.audio_config)

    def get_audio_features(self, **inputs):
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerModel

        return Qwen3OmniMoeThinkerModel.get_audio_features(self, **inputs)


@pytest.mark.slow  # the published size on the CPU: 650M parameters, forward and backward, 1 to 3 min
def test_the_full_size_audio_tower_per_component():
    """transformers' default audio tower (the worked value's) on a 12.5 s and a 1.5 s clip: 163 and
    20 tokens, windows of 104, every component exact."""
    from pathlib import Path

    cfg = json.loads((Path(__file__).parents[2] / "tests" / "fixtures" / "hf" / "structural" / FIXTURE).read_text())
    audio = spec_from_structure(cfg).audio
    assert audio is not None
    torch.manual_seed(0)
    model = _AudioOnly(hf.config_from_dict(cfg).thinker_config)
    clips = [1250, 150]
    tally, feats = am.run_audio(model, am.clip_inputs(clips, audio.mel_bins))
    sums = call_sums(audio, clips)
    assert audio.flops_by_component(sums) == am.measured_flops(tally)
    assert feats.shape[0] == sums[AUDIO_TOKENS] == 183 and sorted(set(tally.calls)) == [(20, 20), (59, 59), (104, 104)]
