"""Gemma 3n counted whole (model_type gemma3n): its vision tower, timm's MobileNet-V5
(packscope.agent.hf_towers.mobilenet_tower), its audio tower (test_hf_audio_gemma3n.py), and the
multimodal embedders its forward runs on every text token, against an independent check: torch's
FlopCounterMode on timm's and transformers' own modules, module by module, never packscope's formula.

transformers builds the vision tower through timm, which needs torchvision: these tests run in the
environment `make test` builds for them (.venv-timm); elsewhere they skip, and the count says to
install timm (test_without_timm_the_count_says_to_install_it)."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from packscope.agent.hf_structure import spec_from_structure  # noqa: E402
from packscope.core.flops import ModelSpec  # noqa: E402
from packscope.core.hf_fields import HFConfigError  # noqa: E402
from packscope.core.vision import VisionSpec, fixed_image_sums  # noqa: E402

HAS_TIMM = importlib.util.find_spec("timm") is not None
needs_timm = pytest.mark.skipif(not HAS_TIMM, reason="timm (with torchvision) is installed in .venv-timm only")


def published() -> dict:
    """transformers' default Gemma3nConfig: the published widths (E4B's decoder, 768² images)."""
    from transformers import Gemma3nConfig

    return Gemma3nConfig().to_dict()


@functools.cache
def published_spec() -> ModelSpec:
    return spec_from_structure(published())


def component(name: str, attentions: set[str]) -> str:
    """Where a convolution of the tower sits, from its module name; else the check fails."""
    if name.startswith("msfa."):
        return "fusion"
    if any(name.startswith(f"{a}.") for a in attentions):
        return "attention"
    if name.startswith(("conv_stem.", "blocks.")):
        return "conv"
    raise AssertionError(f"a convolution at {name!r} that the check does not place")


ROOT = "TimmWrapperModel.timm_model"  # FlopCounterMode's name of the timm encoder in transformers' wrapper


def tower_counts(encoder: nn.Module, counts: dict[str, dict]) -> dict[str, int]:
    """Forward FLOPs by component from FlopCounterMode's per-module counts (timm's module names): each
    convolution where it ran, and each attention block's own matmuls as its count beyond its
    convolutions. Every counted FLOP placed."""
    root = ROOT
    total = {name: sum(ops.values()) for name, ops in counts.items()}
    convs = {n for n, m in encoder.named_modules() if isinstance(m, nn.Conv2d)}
    attentions = {n for n, m in encoder.named_modules() if type(m).__name__ == "MultiQueryAttention2d"}
    out: dict[str, int] = defaultdict(int)
    for name in convs:
        out[component(name, attentions)] += total.get(f"{root}.{name}", 0)
    for name in attentions:
        inner = sum(total.get(f"{root}.{c}", 0) for c in convs if c.startswith(f"{name}."))
        out["core_full"] += total[f"{root}.{name}"] - inner
    assert sum(out.values()) == total["Global"], (dict(out), total["Global"])
    return dict(out)


def per_image(vision: VisionSpec) -> dict[str, int]:
    """The count's FLOPs of one image, by the tower's components (the projector apart)."""
    parts = vision.flops_by_component(fixed_image_sums(vision, 1))
    return {k: v for k, v in parts.items() if k in ("conv", "attention", "core_full", "fusion")}


@needs_timm
def test_the_published_tower_per_component_on_the_meta_device():
    """The published tower at its 768² input, forward on the meta device: every component of one
    image, and of three, equal to torch's counts; the 16 x 16 soft tokens through embed_vision."""
    from transformers import AutoModel, Gemma3nVisionConfig

    vision = published_spec().vision
    assert vision is not None and vision.tower == "mobilenetv5"
    assert (vision.image_grid, vision.patch_size, vision.projector) == ((16, 16), 48, ((2048, 2048),))
    with torch.device("meta"):
        tower = AutoModel.from_config(Gemma3nVisionConfig())
    for images in (1, 3):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            out = tower(pixel_values=torch.empty(images, 3, 768, 768, device="meta"), do_pooling=False)
        measured = {k: 3 * v for k, v in tower_counts(tower.timm_model, counter.get_flop_counts()).items()}
        assert {k: images * v for k, v in per_image(vision).items()} == measured
    assert tuple(out.last_hidden_state.shape) == (3, 2048, 16, 16)


@needs_timm
def test_the_tower_forward_and_backward_on_the_cpu_at_a_small_size():
    """The real mobilenetv5_300m_enc on the CPU at 128² (its timm config's input size set so, as a
    checkpoint's would be): the count read at that size equals torch's counts of a real forward, per
    component; in the backward every convolution's output gets a gradient and the attention's
    matmuls run twice."""
    from transformers import AutoModel, Gemma3nConfig
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nMultimodalEmbedder

    from packscope.agent.hf_towers import mobilenet_tower

    config = Gemma3nConfig()
    with torch.device("meta"):  # what the structural count reads, as it builds it
        meta = AutoModel.from_config(config.vision_config)
        embed = Gemma3nMultimodalEmbedder(config.vision_config, config.text_config)
    meta.timm_model.pretrained_cfg = {**meta.timm_model.pretrained_cfg, "input_size": (3, 128, 128)}
    vision = mobilenet_tower("gemma3n", "vision_tower", meta, embed, config)
    torch.manual_seed(0)
    tower = AutoModel.from_config(config.vision_config)  # the same tower on the CPU, run for real
    # FlopCounterMode has no formula for the CPU's fused attention kernel: timm's own unfused path
    # (its fused_attn switch, TIMM_FUSED_ATTN=0) runs the same QKᵀ and P·V as counted matmuls
    attentions = [m for m in tower.modules() if type(m).__name__ == "MultiQueryAttention2d"]
    assert attentions
    for attn in attentions:
        attn.fused_attn = False
    assert (vision.patch_size, vision.image_grid) == (8, (16, 16))
    convs = [m for m in tower.modules() if isinstance(m, nn.Conv2d)]
    got: set[int] = set()

    def hook(module, args, output):
        key = id(module)
        output.register_hook(lambda grad: got.add(key))

    handles = [m.register_forward_hook(hook) for m in convs]
    pixels = torch.randn(2, 3, 128, 128)
    with FlopCounterMode(display=False) as counter:
        out = tower(pixel_values=pixels, do_pooling=False)
    forward = counter.get_flop_counts()
    measured = {k: 3 * v for k, v in tower_counts(tower.timm_model, forward).items()}
    assert {k: 2 * v for k, v in per_image(vision).items()} == measured
    with FlopCounterMode(display=False) as counter:
        out.last_hidden_state.float().sum().backward()
    for handle in handles:
        handle.remove()
    backward = {str(op).split(".")[-1]: v for op, v in counter.get_flop_counts()["Global"].items()}
    # every convolution's output gets a gradient; the attention's matmuls run both gradients. (torch's
    # formula for a convolution's backward ignores groups, so it is not compared for the depthwise ones.)
    assert got == {id(m) for m in convs}
    assert backward["bmm"] == 2 * sum(v for op, v in forward["Global"].items() if str(op).endswith("bmm"))


@needs_timm
def test_every_text_token_goes_through_both_embedders():
    """Gemma3nModel.forward with input_ids embeds every token through embed_vision and embed_audio
    (the hard-token path): on the meta device, a text-only forward counts their projections once
    per token, the count's multimodal_embed."""
    from transformers import Gemma3nConfig, Gemma3nForConditionalGeneration

    spec = published_spec()
    with torch.device("meta"):
        model = Gemma3nForConditionalGeneration(Gemma3nConfig())
    tokens = 24
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=torch.zeros(1, tokens, dtype=torch.long, device="meta"))
    counts = counter.get_flop_counts()
    embedders = sum(
        sum(ops.values()) for name, ops in counts.items() if re.fullmatch(r".*\.model\.embed_(vision|audio)", name)
    )
    assert embedders > 0 and 3 * embedders == tokens * dict(spec.measured.c_lin)["multimodal_embed"]


@needs_timm
def test_the_wire_dict_carries_both_towers():
    spec = published_spec()
    wire = json.loads(json.dumps(spec.to_dict()))
    assert wire["vision"]["tower"] == "mobilenetv5" and wire["audio"]["tower"] == "gemma3n"
    assert ModelSpec.from_dict(wire) == spec


@needs_timm
def test_the_hf_callbacks_record_is_the_cli_and_the_api_to_the_integer(tmp_path, capsys):
    """One step of two micro-batches, one with two images and two clips, one with an image alone:
    the record (pixel_values kept as their shape, the clips' mask as the feature extractor writes it)
    carries the vision and audio sums, and its FLOPs are `packscope flops --images --audio` and the
    API's in every view."""
    from packscope.commands.cli import main
    from packscope.core.flops import packs_breakdown_by_kind
    from tests.agent.audio_callback import ROW, VIEWS, callback_record
    from tests.core import audio_gemma3n_meta as gm

    spec = published_spec()
    assert spec.vision is not None and spec.audio is not None
    calls = [[250, 70], []]
    batches = [
        {"pixel_values": torch.empty(2, 3, 768, 768, device="meta"), **gm.clip_inputs(calls[0], spec.audio.mel_bins)},
        {"pixel_values": torch.empty(1, 3, 768, 768, device="meta")},
    ]
    record = callback_record(spec, batches)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(published()))
    args = ["flops", "--hf-config", str(path), "--pack-length", str(ROW), "--pack", str(ROW), "--pack", str(ROW)]
    assert main([*args, "--images", "3", "--audio", "250,70"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert {k: record[k] for k in cli["vision"]["sums"]} == cli["vision"]["sums"]
    assert {k: record[k] for k in cli["audio"]["sums"]} == cli["audio"]["sums"]
    decoder = packs_breakdown_by_kind(spec, [[ROW]] * 2, ROW)
    towers = spec.vision.flops(fixed_image_sums(spec.vision, 3)) + spec.audio.flops(spec.audio.batch_sums([[250, 70]]))
    for view in VIEWS:
        assert cli[f"flops_{view}"] < 2**53
        want = getattr(decoder, f"flops_{view}") + towers
        assert record[f"flops_{view}"] == float(cli[f"flops_{view}"]) == float(want), view


@pytest.mark.skipif(HAS_TIMM, reason="timm is installed here")
def test_without_timm_the_count_says_to_install_it():
    with pytest.raises(HFConfigError, match="pip install timm") as caught:
        spec_from_structure(published())
    assert "\n" not in str(caught.value)


@needs_timm
def test_the_pages_published_values_are_the_codes():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "flops.md").read_text()
    table = doc.split("<!-- gemma3n-vision:start -->\n")[1].split("<!-- gemma3n-vision:end -->")[0]
    vision = published_spec().vision
    assert vision is not None
    line = "`image_macs`: " + ", ".join(f"{k} {v}" for k, v in vision.image_macs)
    assert line in table, line
    per_token = dict(published_spec().measured.c_lin)["multimodal_embed"]
    assert f"= {per_token} FLOPs a token" in doc


@needs_timm
def test_the_wrappers_decoder_is_its_text_config_alone_plus_the_embedders():
    """The decoder the wrapper counts is gemma3n_text's (held to torch in test_hf_structure.py), with
    the embedders' work on every text token beside it."""
    spec = published_spec()
    text = spec_from_structure({**published()["text_config"], "model_type": "gemma3n_text"})
    wrapper = dict(spec.c_lin_by_component)
    assert wrapper.pop("multimodal_embed") == 6 * (2048 + 1536) * 2048
    assert {k: v for k, v in wrapper.items() if v} == {k: v for k, v in text.c_lin_by_component.items() if v}
    assert (spec.c_core_by_kind, spec.kinds) == (text.c_core_by_kind, text.kinds)


@needs_timm
def test_a_module_the_tower_reader_does_not_know_is_refused_by_name():
    from transformers import AutoModel, Gemma3nConfig
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nMultimodalEmbedder

    from packscope.agent.hf_towers import mobilenet_tower

    config = Gemma3nConfig()
    with torch.device("meta"):
        tower = AutoModel.from_config(config.vision_config)
        embed = Gemma3nMultimodalEmbedder(config.vision_config, config.text_config)
        tower.timm_model.blocks[0].extra = nn.Linear(8, 8)
    with pytest.raises(HFConfigError, match=r"its modules Linear are not priced") as caught:
        mobilenet_tower("gemma3n", "vision_tower", tower, embed, config)
    assert "\n" not in str(caught.value)
    del tower.timm_model.blocks[0].extra
    config.vision_soft_tokens_per_image = 64
    with pytest.raises(HFConfigError, match=r"its 16 x 16 output is not vision_soft_tokens_per_image \(64\)"):
        mobilenet_tower("gemma3n", "vision_tower", tower, embed, config)


class WithClips:
    """Each example one padded row opened by a clip's audio placeholders (audio_soft_tokens_per_image
    of them, as the processor writes), its clip padded to the batch's longest in input_features, with
    the mask the feature extractor writes. Keeps the clips of every batch."""

    def __init__(self, audio_token: int, placeholders: int, mel_bins: int) -> None:
        self.audio_token, self.placeholders, self.mel_bins = audio_token, placeholders, mel_bins
        self.calls: list[list[int]] = []

    def __call__(self, features):
        from tests.core import audio_gemma3n_meta as gm

        clips = [20 + 37 * len(f["input_ids"]) % 100 for f in features]  # at most 8 kept positions each
        rows = [[self.audio_token] * self.placeholders + f["input_ids"] for f in features]
        width = max(map(len, rows))
        self.calls.append(clips)
        return {
            "input_ids": torch.tensor([r + [0] * (width - len(r)) for r in rows]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
            "labels": torch.tensor(
                [[-100 if t == self.audio_token else t for t in r] + [-100] * (width - len(r)) for r in rows]
            ),
            **gm.clip_inputs(clips, self.mel_bins),
        }


@needs_timm
def test_the_trainers_batches_are_counted_with_their_clips():
    """A Gemma 3n with a tiny decoder and audio tower (the published vision tower beside, unused)
    trained by the Trainer on batches with clips: each record holds the reference sums of its
    interval's calls, and its FLOPs are the decoder's on its token sums (the embedders included)
    plus the audio tower's, in every view."""
    import dataclasses

    import transformers
    from transformers import Gemma3nConfig

    from packscope.agent.integrations.hf import PackscopeCallback
    from packscope.core.attention import SUM_NAMES as ATTENTION_SUM_NAMES
    from packscope.core.audio_gemma4 import Gemma4AudioSpec, batch_sums
    from tests.agent.structural_configs import STRUCTURAL

    text = {k: v for k, v in STRUCTURAL["gemma3n_text"].items() if k != "model_type"}
    text |= {"vocab_size": 262400, "vocab_size_per_layer_input": 262144}  # the multimodal ids embed
    audio = {"hidden_size": 32, "conf_num_attention_heads": 4, "conf_num_hidden_layers": 2}
    audio |= {"sscp_conv_channel_size": [8, 4], "input_feat_size": 16}
    config = Gemma3nConfig(text_config=text, audio_config=audio, audio_soft_tokens_per_image=8)
    spec = spec_from_structure(config.to_dict())
    assert isinstance(spec.audio, Gemma4AudioSpec) and spec.vision is not None
    torch.manual_seed(0)
    model = transformers.Gemma3nForConditionalGeneration(config)
    collator = WithClips(config.audio_token_id, 8, spec.audio.mel_bins)
    cb = PackscopeCallback(run_name="hf-gemma3n", log_every=2, check_cross_documents=False)
    g = torch.Generator().manual_seed(1)
    data = [
        {"input_ids": torch.randint(3, 200, (int(k),), generator=g).tolist()}
        for k in torch.randint(2, 12, (8,), generator=g)
    ]
    args = transformers.TrainingArguments(
        output_dir="hf-test", per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=2,
        logging_steps=2, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
        remove_unused_columns=False,
    )  # fmt: skip
    transformers.Trainer(model=model, args=args, data_collator=collator, callbacks=[cb], train_dataset=data).train()
    records = list(cb.agent.records)
    assert len(records) == 1 and cb.agent.model == spec
    decoder = dataclasses.replace(spec, audio=None, vision=None)
    (record,) = records
    want = batch_sums(spec.audio, collator.calls)
    assert want["audio_tokens"] and {name: record[name] for name in want} == want
    sums = {name: record[name] for name in ATTENTION_SUM_NAMES}
    flops = decoder.triad_by_kind(record["tokens"], record["real_tokens"], sums)
    tower = spec.audio.flops(want)
    assert {v: record[f"flops_{v}"] for v in flops} == {v: float(f + tower) for v, f in flops.items()}
