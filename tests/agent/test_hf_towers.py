"""The towers the structural count reads (packscope.agent.hf_towers) against an independent check:
what transformers' own tower computes on images, forward and backward on the CPU
(tests/core/vision_meta.py: the GEMMs that received a gradient, by component, and the (query, key)
pairs of every attention call), never packscope's formula. The wrappers' decoders are held to
torch's counts in test_hf_structure.py with the other decoders."""

from __future__ import annotations

import functools
import json
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from packscope.agent.hf_structure import spec_from_any_hf_dict, spec_from_structure  # noqa: E402
from packscope.agent.hf_towers import grid_tower  # noqa: E402
from packscope.core.flops import ModelSpec  # noqa: E402
from packscope.core.hf_fields import HFConfigError  # noqa: E402
from packscope.core.vision import (  # noqa: E402
    PADDED_ROWS,
    VISION_TOWERS,
    VisionSpec,
    batch_sums,
    decoder_tokens,
    padded_rows_sums,
)
from tests.agent.structural_configs import STRUCTURAL, WRAPPERS  # noqa: E402
from tests.core import hf_meta as hf  # noqa: E402
from tests.core import vision_meta as vm  # noqa: E402

# Images and videos of t x h x w patches (h, w multiples of the 2 x 2 merge): one image, a video of
# two temporal patches beside a small image, and several frames of a non-square one; a fixed-size
# tower (InternVL) takes 1, 2 and 3 tiles.
GRIDS = [[(1, 4, 6)], [(2, 4, 4), (1, 2, 2)], [(3, 6, 2), (1, 2, 8)]]
TILES = (1, 2, 3)
# A padded-rows tower (Gemma 4) stacks its images in one tensor: same-size images here, unpadded
# (each fills its slots); test_gemma4_padding_slots_* pads them.
ROWS = [[(1, 4, 6)], [(1, 4, 4)] * 2, [(1, 2, 8)] * 3]


def batch(vision: VisionSpec, index: int) -> list[tuple[int, int, int]]:
    if vision.image_grid is not None:
        return [(1, *vision.image_grid)] * TILES[index]
    if VISION_TOWERS[vision.tower] == PADDED_ROWS:
        return ROWS[index]
    return GRIDS[index]


@functools.cache
def cpu_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    config = hf.config_from_dict(WRAPPERS[name])
    vm.use_counting_attention(config)
    return hf.build(config, "cpu")


def row_inputs(vision: VisionSpec, grids: list[tuple[int, int]], slots: int) -> dict[str, torch.Tensor]:
    """What Gemma 4's processor hands the model: each image's patches (row-major) padded to ``slots``,
    and their (x, y) positions, (-1, -1) on the padding."""
    pixels = torch.randn(len(grids), slots, vision.patch_inputs)
    positions = torch.full((len(grids), slots, 2), -1, dtype=torch.long)
    for i, (h, w) in enumerate(grids):
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        positions[i, : h * w] = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=1)
    return {"pixel_values": pixels, "image_position_ids": positions}


def tower_inputs(vision: VisionSpec, grids: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
    """What the processor hands the model: one row of pixels per patch and the grids, or the tiles."""
    if VISION_TOWERS[vision.tower] == PADDED_ROWS:
        return row_inputs(vision, [(h, w) for _, h, w in grids], max(h * w for _, h, w in grids))
    if vision.image_grid is not None:
        side = vision.image_grid[0] * vision.patch_size
        return {"pixel_values": torch.randn(len(grids), 3, side, side)}
    patches = sum(t * h * w for t, h, w in grids)
    return {"pixel_values": torch.randn(patches, vision.patch_inputs), "image_grid_thw": torch.tensor(grids)}


def meta_inputs(model: nn.Module, vision: VisionSpec, grids: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
    """``tower_inputs`` on the meta device, with what a Qwen tower computes from the grid's values
    (rotary positions, the interpolated position grid) computed on the CPU by its own helpers."""
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

    if vision.image_grid is not None:
        return {k: torch.empty_like(v, device="meta") for k, v in tower_inputs(vision, grids).items()}
    table = torch.tensor(grids)
    visual = model.model.visual
    indices, weights = get_vision_interpolation_indices_and_weights(
        table,
        num_grid_per_side=visual.num_grid_per_side,
        mode=visual.interpolation_mode,
        align_corners=visual.interpolation_align_corners,
        spatial_merge_size=vision.spatial_merge,
    )
    return {
        "pixel_values": torch.empty(sum(t * h * w for t, h, w in grids), vision.patch_inputs, device="meta"),
        "image_grid_thw": table,
        "position_ids": get_vision_position_ids(table, vision.spatial_merge).to("meta"),
        "interp_indices": indices.to("meta"),
        "interp_weights": weights.to("meta"),
    }


@pytest.mark.slow  # full-size towers, forward and backward on shapes: 10 to 20 s each
@pytest.mark.parametrize("fixture", ["qwen3_vl.json", "qwen3_5.json", "internvl.json"])
def test_full_size_towers_per_component_on_the_meta_device(fixture):
    """transformers' defaults (tests/fixtures/hf/structural/, the worked values of docs/flops.md) at
    their real size: the same images as the page, every component exact."""
    from pathlib import Path

    cfg = json.loads((Path(__file__).parents[1] / "fixtures" / "hf" / "structural" / fixture).read_text())
    vision = spec_from_structure(cfg).vision
    assert vision is not None
    config = hf.config_from_dict(cfg)
    vm.use_counting_attention(config)
    model = hf.build(config, "meta")
    grids = [(1, 28, 40), (4, 20, 36)] if vision.image_grid is None else [(1, *vision.image_grid)] * 3
    tally, _ = vm.run_tower(model, vision.tower, meta_inputs(model, vision, grids), backward=True)
    assert vision.flops_by_component(batch_sums(vision, grids)) == vm.measured_flops(tally, windowed_blocks=set())


@pytest.mark.parametrize("index", range(3))
@pytest.mark.parametrize("name", WRAPPERS)
def test_tower_flops_per_component_are_what_the_tower_computes(name, index):
    vision = spec_from_structure(WRAPPERS[name]).vision
    assert vision is not None
    grids = batch(vision, index)
    tally, tokens = vm.run_tower(cpu_model(name), vision.tower, tower_inputs(vision, grids), backward=True)
    sums = batch_sums(vision, grids)
    assert vision.flops_by_component(sums) == vm.measured_flops(tally, windowed_blocks=set())
    assert not any(tally.forward_only_macs.values())  # every GEMM that ran is model work
    assert tokens.shape[0] == decoder_tokens(vision, sums)


@pytest.mark.parametrize("slots", [24, 32])
def test_gemma4_padding_slots_are_counted_as_the_tower_runs_them(slots):
    """Images of 4 x 4 and 2 x 4 patches padded to the batch's slots: every slot goes through the GEMMs,
    every slot's query attends to its image's real keys (SDPA's mask hides the padding keys). The
    projector runs on the real pooled tokens only, and the count prices it per slot: its one known
    excess, exactly the padding's pooled tokens through embed_vision (docs/flops.md)."""
    from packscope.agent.vision import rows_sums

    vision = spec_from_structure(WRAPPERS["gemma4"]).vision
    assert vision is not None
    grids = [(4, 4), (2, 4)]
    inputs = row_inputs(vision, grids, slots)
    tally, tokens = vm.run_tower(cpu_model("gemma4"), vision.tower, inputs, backward=True)
    sums = padded_rows_sums(vision, grids, slots)
    assert {k: int(v) for k, v in rows_sums(vision, inputs["image_position_ids"]).items()} == sums
    counted, measured = vision.flops_by_component(sums), vm.measured_flops(tally, windowed_blocks=set())
    padding_tokens = (2 * slots - 16 - 8) // vision.spatial_merge**2
    assert padding_tokens > 0 and tokens.shape[0] == (16 + 8) // vision.spatial_merge**2
    assert counted["projector"] - measured["projector"] == 6 * padding_tokens * vision.projector_macs
    assert {k: v for k, v in counted.items() if k != "projector"} == {
        k: v for k, v in measured.items() if k != "projector"
    }


@pytest.mark.slow  # the default tower's full widths on the CPU (small images): about 10 s
def test_gemma4_default_tower_per_component_at_full_width():
    """gemma4.json's tower (docs/flops.md's worked value) at its real widths: its own modules, built
    alone on the CPU with the wrapper's projector and image path (Gemma4Model.get_image_features: on
    the meta device its split per image reads values back), on a 6 x 9 and a 6 x 6 patch image padded to
    63 slots. Every component as the tower computes it; the projector over by the padding's tokens."""
    from pathlib import Path

    from transformers.models.gemma4 import modeling_gemma4 as g4

    cfg = json.loads((Path(__file__).parents[1] / "fixtures" / "hf" / "structural" / "gemma4.json").read_text())
    vision = spec_from_structure(cfg).vision
    assert vision is not None
    config = hf.config_from_dict(cfg)
    vm.use_counting_attention(config)

    class ImagePath(nn.Module):  # the parts of Gemma4Model that get_image_features reads
        get_image_features = g4.Gemma4Model.get_image_features

        def __init__(self) -> None:
            super().__init__()
            self.config = config
            self.vision_tower = g4.Gemma4VisionModel(config.vision_config)
            self.embed_vision = g4.Gemma4MultimodalEmbedder(config.vision_config, config.text_config)

    torch.manual_seed(0)
    model = ImagePath().requires_grad_(False)  # input gradients only: every GEMM still gets its own
    grids, slots = [(6, 9), (6, 6)], 63
    inputs = row_inputs(vision, grids, slots)
    inputs["pixel_values"].requires_grad_(True)
    tally, tokens = vm.run_tower(model, vision.tower, inputs, backward=True)
    counted, measured = (
        vision.flops_by_component(padded_rows_sums(vision, grids, slots)),
        vm.measured_flops(tally, windowed_blocks=set()),
    )
    padding_tokens = (2 * slots - 54 - 36) // 9
    assert tokens.shape[0] == (54 + 36) // 9 and padding_tokens == 4
    assert counted["projector"] - measured["projector"] == 6 * padding_tokens * vision.projector_macs
    assert {k: v for k, v in counted.items() if k != "projector"} == {
        k: v for k, v in measured.items() if k != "projector"
    }


def test_the_deepstack_mergers_are_in_the_projector():
    """Qwen3-VL's mergers after blocks 0 and 1 each run once per decoder token beside the final one:
    three times the merger's work; Qwen3.5's tower has the final merger only."""
    with_deepstack = spec_from_structure(WRAPPERS["qwen3_vl"]).vision
    without = spec_from_structure(WRAPPERS["qwen3_5"]).vision
    assert with_deepstack is not None and without is not None
    assert with_deepstack.projector_macs == 3 * without.projector_macs
    assert with_deepstack.c_lin - without.c_lin == 2 * without.c_lin_by_component["projector"]


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_5_moe"])
def test_a_wrappers_decoder_is_its_text_config_alone(name):
    wrapper = spec_from_structure(WRAPPERS[name])
    text = spec_from_structure(WRAPPERS[name]["text_config"])
    assert wrapper.c_lin_by_component == text.c_lin_by_component
    assert (wrapper.c_core_by_kind, wrapper.kinds) == (text.c_core_by_kind, text.kinds)
    assert text.vision is None and wrapper.vision is not None


@pytest.mark.parametrize("name", WRAPPERS)
def test_a_wrapper_survives_the_wire_dict(name):
    spec = spec_from_structure(WRAPPERS[name])
    back = ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back == spec and back.vision == spec.vision


@pytest.mark.parametrize("name", WRAPPERS)
def test_the_cli_and_the_hf_callback_count_the_same_images_alike(name, tmp_path, capsys):
    """`packscope flops --hf-config` with --image, and the agent fed the batch the callback forwards
    (image_grid_thw beside the text form): the same vision sums and the same FLOPs."""
    from packscope.agent import Agent, AgentConfig, spec_from_any_hf_config
    from packscope.agent.integrations.batches import image_kwargs
    from packscope.backend.ingest.record import decode
    from packscope.commands.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(WRAPPERS[name]))
    model = spec_from_any_hf_config(hf.config_from_dict(WRAPPERS[name]))
    assert model.vision is not None
    grids = batch(model.vision, 1)
    images = [arg for t, h, w in grids for arg in ("--image", f"{t},{h},{w}")]
    if model.vision.image_grid is not None:
        images = ["--images", str(len(grids))]
    assert main(["flops", "--hf-config", str(path), "--pack", "10,6", "--pack-length", "16", *images]) == 0
    cli = json.loads(capsys.readouterr().out)

    inputs = {"input_ids": torch.zeros(1, 16, dtype=torch.long), **tower_inputs(model.vision, grids)}
    agent = Agent(AgentConfig(log_every=1, count_syncs=False), model=model)
    agent.step_begin()
    agent.observe_batch(
        cu_seqlens=torch.tensor([0, 10, 16], dtype=torch.int32), shape=(1, 16), **image_kwargs(inputs, model.vision)
    )
    agent.step_end()
    agent.close()
    (record,) = agent.records
    assert {k: record[k] for k in cli["vision"]["sums"]} == cli["vision"]["sums"]
    assert (record["flops_thd"], record["flops_bshd"]) == (float(cli["flops_thd"]), float(cli["flops_bshd"]))
    assert cli["vision"]["flops"] > 0 and cli["vision"]["tower"] == model.vision.tower
    assert decode(json.dumps({"intervals": [record]}).encode()).ignored == []


# -- refusals, one line each ---------------------------------------------------------------------


def test_a_tower_the_count_does_not_know_is_refused_by_its_class_once_built():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("qwen2_vl").to_dict()  # Qwen2-VL's ViT: no reader, hand-written or structural
    with pytest.raises(HFConfigError, match=r"'visual' \(Qwen2VisionTransformerPretrainedModel\)") as caught:
        spec_from_any_hf_dict(cfg)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("value", [None, {}])
def test_a_wrapper_without_its_vision_config_is_refused(value):
    cfg = {k: v for k, v in WRAPPERS["qwen3_vl"].items() if k != "vision_config"}
    if value is not None:
        cfg["vision_config"] = value
    with pytest.raises(HFConfigError, match=r"'vision_config' is (missing|empty)"):
        spec_from_structure(cfg)


def test_a_deepstack_merger_that_never_runs_is_refused():
    """A deepstack index past the tower's blocks builds a merger its forward never calls."""
    cfg = {
        **WRAPPERS["qwen3_vl"],
        "vision_config": {**WRAPPERS["qwen3_vl"]["vision_config"], "deepstack_visual_indexes": [5]},
    }
    with pytest.raises(HFConfigError, match=r"deepstack_visual_indexes \[5\]"):
        spec_from_structure(cfg)


def test_a_gemm_the_tower_walk_does_not_place_is_refused():
    model = hf.build(hf.config_from_dict(WRAPPERS["qwen3_5"]), "meta")
    tower = model.model.visual
    grid_tower("qwen3_5", "visual", tower)  # as built: every GEMM placed
    with torch.device("meta"):
        tower.blocks[1].extra = nn.Linear(16, 16)
    with pytest.raises(HFConfigError, match="block 1's GEMMs"):
        grid_tower("qwen3_5", "visual", tower)
    del tower.blocks[1].extra
    with torch.device("meta"):
        tower.head = nn.Linear(16, 16)
    with pytest.raises(HFConfigError, match=r"its module 'head' \(Linear\) is not placed"):
        grid_tower("qwen3_5", "visual", tower)


def test_a_decoder_only_model_has_no_tower():
    assert spec_from_structure(STRUCTURAL["olmo2"]).vision is None


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("vision_feature_layer", -2, "vision_feature_layer -2 is not read"),
        ("vision_feature_select_strategy", "full", "keeps the class token"),
        ("downsample_ratio", 0.4, "downsample_ratio 0.4 is not 1/k"),
    ],
)
def test_internvl_fields_the_tile_reader_does_not_read_are_refused(key, value, message):
    with pytest.raises(HFConfigError, match=message):
        spec_from_structure({**WRAPPERS["internvl"], key: value})


def test_an_internvl_tile_attends_with_its_class_token():
    """Each tile's 16 patches and its class token attend to each other (17² pairs a block); the
    class token is dropped before the pixel shuffle, so 4 decoder tokens a tile."""
    vision = spec_from_structure(WRAPPERS["internvl"]).vision
    assert vision is not None and vision.class_tokens == 1 and vision.projected_class_tokens == 0
    sums = batch_sums(vision, [(1, 4, 4)] * 3)
    assert sums["vision_sq_sum"] == 3 * 17**2 and decoder_tokens(vision, sums) == 12


@pytest.mark.parametrize("part", ["text_config", "vision_config"])
def test_a_key_a_sub_config_does_not_define_is_refused_by_name(part):
    cfg = {**WRAPPERS["qwen3_vl"], part: {**WRAPPERS["qwen3_vl"][part], "moe_every_other_layer": True}}
    with pytest.raises(HFConfigError, match=f"'{part}.moe_every_other_layer' is not a field"):
        spec_from_structure(cfg)


def published_style(name: str) -> dict:
    """A tiny Qwen3.5 wrapper with the keys Qwen's published config.json carries and transformers'
    config classes do not define (Qwen3.5-27B's, as quoted in ModelCloud/GPTQModel's issue threads)."""
    cfg = WRAPPERS[name]
    text = {
        **cfg["text_config"],
        "attn_output_gate": True,
        "mlp_only_layers": [],
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "mamba_ssm_dtype": "float32",
    }
    # old checkpoints name the tower by the wrapper's model_type; transformers renames it
    vision = {**cfg["vision_config"], "model_type": name, "deepstack_visual_indexes": []}
    return {**cfg, "text_config": text, "vision_config": vision}


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_5_moe"])
def test_a_published_qwen3_5_config_counts_as_the_model_transformers_builds(name):
    """The output gate and the empty lists are what the modeling code hardwires; the MTP module is not
    built by transformers: left out and named, as the hand-written Qwen3-Next reader does."""
    cfg = published_style(name)
    spec = spec_from_structure(cfg)
    plain = spec_from_structure(WRAPPERS[name])
    assert spec == plain and spec.mtp_depth == 0
    assert spec.not_counted == ("the MTP module (mtp_num_hidden_layers=1), which transformers does not build",)
    assert cfg["vision_config"]["model_type"] == name  # the caller's dict is left as it was


@pytest.mark.parametrize(
    "part, key, value",
    [("text_config", "attn_output_gate", False), ("vision_config", "deepstack_visual_indexes", [1])],
)
def test_a_value_the_modeling_code_does_not_build_is_refused_by_name(part, key, value):
    cfg = published_style("qwen3_5")
    cfg[part] = {**cfg[part], key: value}
    with pytest.raises(HFConfigError, match=re.escape(f"'{part}.{key}' is {value!r}, but transformers' modeling")):
        spec_from_structure(cfg)
