"""mllama (Llama 3.2 Vision) counted from its modules (packscope.agent.hf_towers.mllama_tower) against
an independent check: transformers' own model, forward on the CPU at tiny size, with

* a forward hook on every nn.Linear and nn.Conv2d counting the multiply-adds it executed (from its
  weight's shape and the tokens it saw), by where it sits, and torch's FlopCounterMode over the same
  forward agreeing with the hooks' total;
* an attention function that counts, for every call, the (query, key) pairs its mask admits, entry
  by entry (transformers' own masks: the tower's aspect-ratio mask, the cross-attention mask after
  transformers zeroes its fully masked rows, the decoder's causal mask), and the call's head widths.

Never packscope's formula: the check is 6 FLOPs per executed multiply-add and 12 per pair and width.
One micro-batch has images on one row and none on the other (two tiles of its first image empty,
its second row's images all padding), another none at all (the cross-attention layers skipped)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from transformers import AutoConfig, AutoModelForImageTextToText  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

from packscope.agent.hf_structure import spec_from_structure  # noqa: E402
from packscope.agent.vision import tiles_sums  # noqa: E402
from packscope.core.flops import ModelSpec, packs_breakdown_by_kind  # noqa: E402
from packscope.core.vision import CROSS_SUMS, VISION_SUMS, tiled_sums  # noqa: E402

COUNT = "packscope_mllama_count"
TEXT = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4}
TEXT |= {"intermediate_size": 48, "vocab_size": 300, "pad_token_id": 0, "cross_attention_layers": [1, 3]}
TEXT |= {"bos_token_id": 1, "eos_token_id": 2}
VISION = {"hidden_size": 16, "attention_heads": 2, "num_hidden_layers": 3, "num_global_layers": 2}
VISION |= {"intermediate_size": 24, "image_size": 20, "patch_size": 4, "intermediate_layers_indices": [0, 2]}
VISION |= {"vision_output_dim": 48, "max_num_tiles": 4}
CONFIG = {"model_type": "mllama", "text_config": TEXT, "vision_config": VISION}
ROWS, LENGTH, IMAGES, TILES = 2, 9, 2, 4
# Row 0: a 4-tile and a 2-tile image; row 1: two padding images (aspect_ratio_id 0, no real tile).
REAL_TILES = [4, 2, 0, 0]
# (image, tile) entries each text token admits: row 0's first tokens precede the images (none:
# transformers then lets them attend to every key), then the first image, then both; row 1's none.
ATTENDED = [[], [], [(0, t) for t in range(4)], [(0, t) for t in range(4)], [(0, t) for t in range(4)]]
ATTENDED += [[(0, t) for t in range(4)] + [(1, 0), (1, 1)]] * 4
ATTENDED += [[]] * LENGTH
VIEWS = ("bshd", "thd", "useful")

CALLS: list[dict[str, Any]] = []


def counting_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention that first counts the pairs its mask admits, entry by entry."""
    rows, heads, q_len, k_len = query.shape[0], query.shape[1], query.shape[-2], key.shape[-2]
    mask = attention_mask
    if mask is None:
        allowed = torch.ones(rows, 1, q_len, k_len, dtype=torch.bool)
    else:
        mask = mask[..., :q_len, :k_len]
        allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
        allowed = allowed.expand(rows, allowed.shape[1], q_len, k_len)
    CALLS.append(
        {
            "kind": type(module).__name__,
            "pairs": int(allowed[:, :1].sum()),  # one head's: the mask is the same for every head
            "width": heads * query.shape[-1],
            "value_width": heads * value.shape[-1],
        }
    )
    groups = heads // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(-1, -2) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return (scores.softmax(-1) @ value).transpose(1, 2).contiguous(), None


AttentionInterface.register(COUNT, counting_attention)


def causal_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """SDPA's mask as booleans, always built (SDPA's own is None, left to is_causal)."""
    return sdpa_mask(*args, **{**kwargs, "allow_is_causal_skip": False})


AttentionMaskInterface.register(COUNT, causal_mask)


def _component(name: str, cross_layers: set[int]) -> str:
    """Where a GEMM sits, from its qualified name in transformers' model."""
    if "vision_model.patch_embedding" in name:
        return "patch_embedding"
    if "vision_model." in name:
        return "attention" if ".self_attn." in name else "mlp"
    if "multi_modal_projector" in name:
        return "projector"
    if name.startswith("lm_head"):
        return "logits"
    layer = int(re.search(r"language_model\.layers\.(\d+)\.", name).group(1))  # type: ignore[union-attr]
    if layer in cross_layers:
        return "cross_attention" if ".cross_attn." in name else "cross_mlp"
    return "text_attention" if ".self_attn." in name else "text_mlp"


def build() -> nn.Module:
    config = AutoConfig.for_model("mllama", text_config=TEXT, vision_config=VISION)
    for part in (config, config.text_config, config.vision_config):
        part._attn_implementation = COUNT
    torch.manual_seed(0)
    return AutoModelForImageTextToText.from_config(config).eval()


@contextmanager
def counting_gemms(model: nn.Module) -> Iterator[dict[str, int]]:
    """The multiply-adds of every Linear and Conv2d the model's forwards run inside the block, by
    component, from their output shapes (which the meta device has too)."""
    cross_layers = set(model.config.text_config.cross_attention_layers)
    macs: dict[str, int] = defaultdict(int)

    def hook(name: str):
        def count(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            if isinstance(module, nn.Linear):
                done = output.numel() // module.out_features * module.in_features * module.out_features
            else:
                done = output.numel() * module.weight[0].numel()
            macs[_component(name, cross_layers)] += done

        return count

    handles = [
        module.register_forward_hook(hook(name))
        for name, module in model.named_modules()
        if isinstance(module, (nn.Linear, nn.Conv2d))
    ]
    try:
        yield macs
    finally:
        for handle in handles:
            handle.remove()


def measure(model: nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, int]:
    """Model FLOPs of one forward by component: 6 per executed multiply-add of each GEMM, 12 per
    admitted pair and attention width (QKᵀ and P·V) of each attention call."""
    CALLS.clear()
    with counting_gemms(model) as macs, torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(**inputs)
    ops = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    gemm_ops = sum(n for op, n in ops.items() if op.split(".")[1] in ("mm", "addmm", "convolution"))
    assert gemm_ops == 2 * sum(macs.values())  # torch's own count of the GEMMs: 2 FLOPs per multiply-add
    out = {key: 6 * value for key, value in macs.items()}
    cores = {"MllamaVisionAttention": "core_full", "MllamaTextCrossAttention": "core_cross"}
    cores["MllamaTextSelfAttention"] = "text_core"
    for call in CALLS:
        assert call["width"] == call["value_width"]
        out[cores[call["kind"]]] = out.get(cores[call["kind"]], 0) + 6 * call["pairs"] * 2 * call["width"]
    return out


def image_inputs() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    side = VISION["image_size"]
    tiles_mask = torch.zeros(ROWS, IMAGES, TILES, dtype=torch.long)
    for image, real in enumerate(REAL_TILES):
        tiles_mask.view(-1, TILES)[image, :real] = 1
    cross = torch.zeros(ROWS, LENGTH, IMAGES, TILES, dtype=torch.long)
    for token, entries in enumerate(ATTENDED):
        for image, tile in entries:
            cross.view(-1, IMAGES, TILES)[token, image, tile] = 1
    return {
        "input_ids": torch.randint(3, 290, (ROWS, LENGTH)),
        "pixel_values": torch.randn(ROWS, IMAGES, TILES, 3, side, side),
        "aspect_ratio_ids": torch.tensor([[1, 5], [0, 0]]),
        "aspect_ratio_mask": tiles_mask,
        "cross_attention_mask": cross,
    }


def reference_sums(spec: ModelSpec) -> dict[str, int]:
    assert spec.vision is not None
    return tiled_sums(spec.vision, (ROWS, LENGTH, IMAGES, TILES), REAL_TILES, [len(e) for e in ATTENDED])


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return spec_from_structure(CONFIG)


def test_the_tower_and_the_cross_attention_are_what_transformers_computes(spec):
    """Every component of a micro-batch with images, exactly: the tower on every tile slot (empty
    tiles and padding images included), each image's tiles and their padding to 8 attending together
    as its mask admits, the projector and the cross layers' k, v per image token, their q, o and MLP
    per text token, and each text token's admitted (image, tile) entries x (patches + 1) pairs."""
    vision = spec.vision
    assert vision is not None and vision.tower == "mllama" and vision.cross_layers == 2
    inputs = image_inputs()
    sums = {k: int(v) for k, v in tiles_sums(vision, inputs).items()}
    assert sums == reference_sums(spec)
    measured = measure(build(), inputs)
    counted = vision.flops_by_component(sums)
    assert counted.pop("core_window") == 0
    tokens = ROWS * LENGTH
    text_lin = spec.c_lin_by_component
    assert measured.pop("text_attention") == tokens * text_lin["attention"]
    assert measured.pop("text_mlp") == tokens * text_lin["dense_mlp"]
    assert measured.pop("logits") == tokens * text_lin["logits"]
    # the decoder's causal pairs: s(s+1)/2 a row, the documented s²/2 convention leaving out the diagonal
    diagonal = 6 * TEXT["hidden_size"] * spec.layers * tokens  # heads x head_dim = hidden here
    assert measured.pop("text_core") - diagonal == ROWS * LENGTH**2 * spec.c_core
    assert measured == counted and all(value > 0 for value in counted.values())


def test_a_micro_batch_without_images_runs_no_cross_attention_layer(spec):
    """No pixel_values: transformers skips the cross-attention layers and the tower; the sums are 0
    and the decoder's self-attention layers are the whole work."""
    assert spec.vision is not None
    inputs = {"input_ids": image_inputs()["input_ids"]}
    measured = measure(build(), inputs)
    assert set(measured) == {"text_attention", "text_mlp", "logits", "text_core"}
    assert {k for k, v in tiles_sums(spec.vision, inputs).items() if v} == set()
    assert measured["text_mlp"] == ROWS * LENGTH * spec.c_lin_by_component["dense_mlp"]


def test_the_decoder_is_the_self_attention_layers_alone(spec):
    """The decoder's layers are its self-attention ones (the cross-attention layers are priced with the
    tower's sums); the cross layers' widths are the modules'."""
    vision = spec.vision
    assert vision is not None and spec.layers == 2
    h, kv = TEXT["hidden_size"], TEXT["hidden_size"] // TEXT["num_attention_heads"] * TEXT["num_key_value_heads"]
    assert (vision.cross_hidden, vision.cross_width, vision.cross_kv_width) == (h, h, kv)
    assert (vision.cross_ffn, vision.cross_gated) == (TEXT["intermediate_size"], True)
    patches = (VISION["image_size"] // VISION["patch_size"]) ** 2
    slots = -(-(patches + 1) // 8) * 8  # transformers pads a tile's patches and class token to a multiple of 8
    assert vision.projector == ((VISION["vision_output_dim"], h),) and vision.class_tokens == slots - patches


def test_the_wire_dict_keeps_the_cross_attention_layers(spec):
    back = ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back == spec and back.vision == spec.vision


def callback_record(spec: ModelSpec, batches: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    from packscope.agent import Agent, AgentConfig
    from packscope.agent.integrations.batches import shapes_of_heavy
    from packscope.agent.integrations.hf import PackscopeCallback

    callback = PackscopeCallback(check_cross_documents=False)
    agent = Agent(AgentConfig(log_every=1, count_syncs=False), model=spec)
    agent.step_begin()
    for batch in batches:
        callback._observe_batch(agent, (), shapes_of_heavy(batch))
    agent.step_end()
    agent.close()
    (record,) = agent.records
    return record


def test_the_callback_the_cli_and_the_api_agree_to_the_integer(spec, tmp_path, capsys):
    """A step of two micro-batches, one with images (on one row) and one without: the HF callback's
    record, `packscope flops --tile-batch` and ModelSpec's own FLOPs, each view, to the integer."""
    from packscope.commands.cli import main

    assert spec.vision is not None
    with_images = image_inputs()
    batches = [with_images, {"input_ids": with_images["input_ids"]}]
    record = callback_record(spec, batches)

    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    real = ",".join(map(str, REAL_TILES))
    attended = ",".join(str(len(e)) for e in ATTENDED)
    args = ["flops", "--hf-config", str(path), "--pack-length", str(LENGTH), *["--pack", str(LENGTH)] * 4]
    args += ["--tile-batch", f"{ROWS},{LENGTH},{IMAGES},{TILES}/real={real}/attended={attended}"]
    assert main(args) == 0
    cli = json.loads(capsys.readouterr().out)

    sums = reference_sums(spec)
    decoder = packs_breakdown_by_kind(spec, [[LENGTH]] * 4, LENGTH)
    api = {view: getattr(decoder, f"flops_{view}") + spec.vision.flops(sums) for view in VIEWS}
    assert cli["vision"]["sums"] == sums and cli["vision"]["decoder_tokens"] == 0
    assert {name: record[name] for name in VISION_SUMS} == sums
    assert all(sums[name] > 0 for name in CROSS_SUMS)
    for view in VIEWS:
        assert cli[f"flops_{view}"] < 2**53
        assert record[f"flops_{view}"] == float(cli[f"flops_{view}"]) == float(api[view]), view


@pytest.mark.parametrize(
    "arg, message",
    [
        ("2,9,2", "a tile batch is ROWS,TEXT,IMAGES,TILES"),
        ("2,9,2,4/real=4,2", "real tiles: one count 0..4 for each of the 2 x 2 images"),
        ("2,9,2,4/attended=9", "attended tiles: one count 0..8 for each of the 2 x 9 text tokens"),
        ("2,9,2,4/seen=1", "a tile batch is ROWS,TEXT,IMAGES,TILES"),
    ],
)
def test_a_bad_tile_batch_is_one_line(arg, message, tmp_path, capsys):
    from packscope.commands.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    try:
        code = main(["flops", "--hf-config", str(path), "--pack", "9", "--tile-batch", arg])
    except SystemExit as exit:  # argparse's own checks of a flag's value
        code = exit.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_the_agent_refuses_a_tile_batch_without_its_masks(spec):
    from packscope.agent import Agent, AgentConfig

    inputs = image_inputs()
    agent = Agent(AgentConfig(log_every=1, count_syncs=False), model=spec)
    agent.step_begin()
    with pytest.raises(ValueError, match="cross_attention_mask is \\[2, text tokens, 2, 4\\]"):
        agent.observe_batch(
            shape=(ROWS, LENGTH), pixel_values=inputs["pixel_values"], aspect_ratio_mask=inputs["aspect_ratio_mask"]
        )
    agent.close()


def test_the_callback_refuses_a_batch_with_the_towers_output_precomputed(spec):
    from packscope.agent.integrations.batches import image_kwargs

    inputs = image_inputs()
    with pytest.raises(ValueError, match="cross_attention_states"):
        image_kwargs({**inputs, "cross_attention_states": torch.zeros(1)}, spec.vision)
    assert set(image_kwargs(inputs, spec.vision)) == {"pixel_values", "aspect_ratio_mask", "cross_attention_mask"}


def test_the_default_model_per_component_at_full_width_on_the_meta_device():
    """transformers' default mllama (Llama 3.2 11B Vision's widths, 448 px tiles of 32 x 32 patches,
    a 32 + 8 layer tower, eight cross-attention layers of forty) on the meta device: the GEMMs it runs
    on one row of 64 text tokens and one 4-tile image, from their output shapes, equal the count's
    components (the pairs need mask values the meta device has none of: the tiny model above holds them)."""
    from transformers import MllamaConfig

    config = MllamaConfig()
    cfg = {"model_type": "mllama", "text_config": config.text_config.to_diff_dict()}
    cfg["vision_config"] = config.vision_config.to_diff_dict()
    spec = spec_from_structure(cfg)
    vision = spec.vision
    assert vision is not None and vision.cross_layers == 8 and vision.image_grid == (32, 32)
    for part in (config, config.text_config, config.vision_config):
        part._attn_implementation = "eager"
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    length, side = 64, config.vision_config.image_size
    with counting_gemms(model) as macs, torch.device("meta"), torch.no_grad():
        model(
            input_ids=torch.zeros(1, length, dtype=torch.long),
            pixel_values=torch.zeros(1, 1, 4, 3, side, side),
            aspect_ratio_ids=torch.ones(1, 1, dtype=torch.long),
            aspect_ratio_mask=torch.ones(1, 1, 4, dtype=torch.long),
            cross_attention_mask=torch.ones(1, length, 1, 4, dtype=torch.long),
        )
    sums = tiled_sums(vision, (1, length, 1, 4))
    counted = vision.flops_by_component(sums)
    for key in ("patch_embedding", "attention", "mlp", "projector", "cross_attention", "cross_mlp"):
        assert 6 * macs.pop(key) == counted[key], key
    text_lin = spec.c_lin_by_component
    assert 6 * macs.pop("text_attention") == length * text_lin["attention"]
    assert 6 * macs.pop("text_mlp") == length * text_lin["dense_mlp"]
    assert 6 * macs.pop("logits") == length * text_lin["logits"] and macs == {}


def test_observing_a_micro_batch_runs_no_op_and_the_boundary_reads_nothing_back(spec, monkeypatch):
    """Between boundaries the agent reads the shapes only (no ATen op runs); at the boundary the two
    masks are counted on their device with no value read back before the interval's one copy."""
    from packscope.agent.accumulator import IntervalAccumulator
    from tests.agent.test_deferred_forms import CountOps

    assert spec.vision is not None
    inputs = image_inputs()
    acc = IntervalAccumulator(vision=spec.vision)
    with CountOps() as ops:
        acc.add_vision({k: inputs[k] for k in ("pixel_values", "aspect_ratio_mask", "cross_attention_mask")})
    assert ops.ops == []

    def refuse(self, *args, **kwargs):
        raise AssertionError("a tensor's value was read on the host")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    out = acc.reduce(torch.device("cpu"))
    monkeypatch.undo()
    from packscope.agent.accumulator import SUM_AT

    sums = {name: int(out[SUM_AT[name]]) + acc.host.counts[name] for name in VISION_SUMS}
    assert sums == reference_sums(spec)


class WithImages:
    """A collator whose micro-batches alternate: rows with images (image_inputs' masks), rows without."""

    def __init__(self) -> None:
        self.calls = 0
        self.sums: list[dict[str, int]] = []

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids = torch.tensor([(f["input_ids"] + [3] * LENGTH)[:LENGTH] for f in features])
        batch = {"input_ids": ids, "labels": ids.clone()}
        if self.calls % 2 == 0:
            images = image_inputs()
            batch |= {k: v for k, v in images.items() if k != "input_ids"}
        self.calls += 1
        return batch


def test_the_trainers_batches_are_counted_with_their_images(spec, tmp_path):
    """A tiny mllama trained by the Trainer, micro-batches with images and without alternating: the
    forward hook keeps pixel_values as its shape and the masks by reference; each record holds the
    reference sums of its interval's micro-batches with images, and its FLOPs are the decoder's on its
    token sums plus the tower's and the cross-attention layers', in every view."""
    import dataclasses

    import transformers

    from packscope.agent.integrations.hf import PackscopeCallback
    from packscope.core.attention import SUM_NAMES as ATTENTION_SUM_NAMES

    assert spec.vision is not None
    config = AutoConfig.for_model("mllama", text_config=TEXT, vision_config=VISION)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    collator = WithImages()
    cb = PackscopeCallback(run_name="hf-mllama", log_every=2, check_cross_documents=False)
    kept: list[str] = []
    observe = cb._pending._observe_step

    def observe_step(forwards):
        kept.extend(kwargs["pixel_values"].device.type for _, kwargs, _ in forwards if "pixel_values" in kwargs)
        observe(forwards)

    cb._pending._observe_step = observe_step
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(3, 290, (LENGTH,), generator=g).tolist()} for _ in range(16)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=4,
        logging_steps=2, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
        remove_unused_columns=False,
    )  # fmt: skip
    transformers.Trainer(model=model, args=args, data_collator=collator, callbacks=[cb], train_dataset=data).train()
    assert kept == ["meta"] * 4  # 4 steps of one micro-batch with images and one without
    records = list(cb.agent.records)
    assert len(records) == 2 and cb.agent.model == spec
    decoder = dataclasses.replace(spec, vision=None)
    for record in records:
        want = {name: 2 * value for name, value in reference_sums(spec).items()}  # two steps, one each
        assert {name: record[name] for name in want} == want
        sums = {name: record[name] for name in ATTENTION_SUM_NAMES}
        flops = decoder.triad_by_kind(record["tokens"], record["real_tokens"], sums)
        tower = spec.vision.flops(want)
        assert {v: record[f"flops_{v}"] for v in flops} == {v: float(f + tower) for v, f in flops.items()}
