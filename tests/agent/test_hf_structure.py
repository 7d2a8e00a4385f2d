"""The structural count (packscope.agent.hf_structure) against an independent check: the FLOPs torch
itself counts (``FlopCounterMode``) in a real forward of each tiny model on the CPU, op by op and
module by module, and, where a hand-written reader also reads a config, that reader's count."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText  # noqa: E402

from packscope.agent.hf_structure import spec_from_any_hf_dict, spec_from_structure  # noqa: E402
from packscope.core.attention import LINEAR  # noqa: E402
from packscope.core.hf_config import spec_from_hf_dict  # noqa: E402
from packscope.core.hf_fields import HFConfigError  # noqa: E402
from tests.agent.structural_configs import STRUCTURAL, WRAPPERS  # noqa: E402
from tests.core.tiny_configs import TINY  # noqa: E402

warnings.filterwarnings("ignore", module="transformers")
LENGTHS = (16, 32)  # two lengths: per-token work is the difference, free of any per-sequence constant
ROUTERS = ("gate", "router", "shared_expert_gate")


def cpu_model(cfg: dict) -> nn.Module:
    """The model transformers builds (a wrapper: its image-text model, towers included), on the CPU."""
    cfg = dict(cfg)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    for part in (config, config.get_text_config()):
        part._attn_implementation = "eager"  # QKᵀ and P·V as matmuls over every (query, key) pair
        part._experts_implementation = "eager"  # one F.linear per expert: ops torch's counter sees
    torch.manual_seed(0)
    wrapper = config.get_text_config() is not config
    return (AutoModelForImageTextToText if wrapper else AutoModelForCausalLM).from_config(config).eval()


def counted_forward(model: nn.Module, length: int) -> dict[str, dict[str, int]]:
    """FLOPs per module name (the class prefix dropped) and op of one forward on ``length`` tokens
    (text only: a wrapper's towers do not run)."""
    ids = torch.randint(0, model.config.get_text_config().vocab_size, (1, length))
    with FlopCounterMode(display=False) as counter:  # with grad: the counter's module tracker needs it
        model(input_ids=ids, use_cache=False)
    out = {}
    for name, ops in counter.get_flop_counts().items():
        key = name.split(".", 1)[1] if "." in name else ""
        out[key] = {str(op): int(n) for op, n in ops.items()}
    return out


ATTENTION_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "attention", "hybrid")


def _linear_layer(model: nn.Module, index: int) -> bool:
    """Whether the config's layer_types make layer ``index`` a linear (recurrent) one, whatever its
    module is called (Kimi-Linear keeps its KDA in ``self_attn``)."""
    types = getattr(model.config.get_text_config(), "layer_types", None)
    return types is not None and types[index] not in ATTENTION_TYPES and "indexed" not in types[index]


def _component(name: str, model: nn.Module) -> str | None:
    """The C_lin component of a GEMM module, by where it sits (a router: None)."""
    parts = name.split(".")
    if name == "lm_head":
        return "logits"
    # Gemma 3n / Gemma 4's parts of their own, by their modules' names
    if any(p.startswith("altup") for p in parts):  # a layer's AltUp, the decoder's stream projections
        return "altup"
    if "laurel" in parts:
        return "laurel"
    if any(p.startswith("per_layer_") for p in parts):  # the decoder's projection, each layer's gates
        return "per_layer_inputs"
    if "layers" not in parts:
        return None
    if any(p in ROUTERS for p in parts):  # the router, or a Linear inside it (Hunyuan's gate.wg)
        return None
    layer = ".".join(parts[: parts.index("layers") + 2])
    if "mlp" in parts and hasattr(model.get_submodule(layer), "experts"):  # Gemma 4: the MLP beside the experts
        return "moe_shared"
    if any(p in ("self_attn", "attention") for p in parts):
        return "linear_attention" if _linear_layer(model, int(parts[parts.index("layers") + 1])) else "attention"
    if any(p in ("linear_attn", "conv", "mamba") for p in parts):
        return "linear_attention"
    if "experts" in parts:
        return "moe_routed"
    if any(p.startswith("shared") for p in parts):
        return "moe_shared"
    return "dense_mlp"


def _outermost_counted(run: dict[str, dict[str, int]], name: str) -> list[int]:
    """The FLOPs of the modules under ``name`` that the counter saw called, each counted once (the
    outermost of nested ones: AltUp's coefficients are called from its methods, never its forward)."""
    called = [k for k in run if k.startswith(name + ".")]
    return [sum(run[k].values()) for k in called if not any(k.startswith(o + ".") for o in called)]


def oracle_gemm_macs(model: nn.Module) -> dict[str, float]:
    """Multiply-adds per token of each component, from the ops torch counted in GEMM modules
    (nn.Linear, nn.Conv1d, fused expert blocks) over two lengths."""
    modules = dict(model.named_modules())
    runs = [counted_forward(model, n) for n in LENGTHS]
    totals: dict[str, float] = {}
    for name, module in modules.items():
        gemm = isinstance(module, nn.Linear) or (
            name.endswith("experts") and any(p.dim() == 3 for p in module.parameters(recurse=False))
        )
        component = _component(name, model) if gemm else None
        if component is None:
            continue
        flops = [sum(run.get(name, {}).values()) for run in runs]
        totals[component] = totals.get(component, 0) + (flops[1] - flops[0]) / (LENGTHS[1] - LENGTHS[0]) / 2
    for name in modules:  # a mixer's causal convolution, called as a module or as F.conv1d on its weight
        parts = name.split(".")
        mixer = parts[-1] in ("linear_attn", "conv", "mamba")
        if parts[-1] in ("self_attn", "attention") and parts[-2].isdigit():
            mixer = _linear_layer(model, int(parts[-2]))
        if mixer and parts[-2].isdigit():
            flops = [run.get(name, {}).get("aten.convolution", 0) for run in runs]
            totals["linear_attention"] += (flops[1] - flops[0]) / (LENGTHS[1] - LENGTHS[0]) / 2
    for name, module in modules.items():  # AltUp's stream mixing: a matmul of the layer itself, in no child
        if hasattr(module, "altup") and name.split(".")[-2] == "layers":
            own = [sum(run.get(name, {}).values()) - sum(_outermost_counted(run, name)) for run in runs]
            totals["altup"] += (own[1] - own[0]) / (LENGTHS[1] - LENGTHS[0]) / 2
    return {k: v for k, v in totals.items() if v}


def oracle_core_widths(model: nn.Module) -> list[float]:
    """n · (d_qk + d_v) of each attention layer: the eager QKᵀ and P·V matmuls (aten.bmm) over all
    T² pairs, 2 FLOPs per multiply-add."""
    length = LENGTHS[1]
    run = counted_forward(model, length)
    out = []
    for name, _ in model.named_modules():
        parts = name.split(".")
        decoder = len(parts) > 2 and parts[-3] == "layers" and parts[-2].isdigit()  # not a tower's encoder.layer.N
        # Qwen3-Omni's audio encoder (test_hf_audio.py), Gemma 4's vision encoder (test_hf_towers.py)
        decoder = decoder and not {"audio_tower", "vision_tower"} & set(parts)
        if parts[-1] in ("self_attn", "attention") and decoder and not _linear_layer(model, int(parts[-2])):
            out.append(run.get(name, {}).get("aten.bmm", 0) / (2 * length * length))
    return out


# DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): its forward-only indexer has a test of its own.
DSA = ("deepseek_v32", "glm_moe_dsa")
# The decoders, and the wrappers' decoders (their towers: test_hf_towers.py).
CONFIGS = {**STRUCTURAL, **WRAPPERS}
MEASURED = [name for name in CONFIGS if name not in DSA]


@pytest.mark.slow
@pytest.mark.parametrize("name", MEASURED)
def test_structural_gemm_work_is_what_torch_counts_in_a_forward(name):
    spec = spec_from_structure(CONFIGS[name])
    ours = {k: v / 6 for k, v in spec.c_lin_by_component.items() if v and k != "linear_attention_state"}
    oracle = oracle_gemm_macs(cpu_model(CONFIGS[name]))
    assert set(ours) == set(oracle), (ours, oracle)
    for key, value in oracle.items():
        assert ours[key] == pytest.approx(value, rel=1e-3), key


@pytest.mark.slow
@pytest.mark.parametrize("name", MEASURED)
def test_structural_attention_widths_are_the_eager_matmuls(name):
    spec = spec_from_structure(CONFIGS[name])
    widths = oracle_core_widths(cpu_model(CONFIGS[name]))
    attention_layers = [kind for kind in spec.kinds if kind != LINEAR]
    assert len(widths) == len(attention_layers)
    per_kind: dict[str, float] = {}
    for kind, width in zip(attention_layers, widths, strict=True):
        per_kind[kind] = per_kind.get(kind, 0) + 3 * width
    assert spec.c_core_by_kind == pytest.approx(per_kind, rel=1e-3)


def pairs_in_forward(model: nn.Module, docs: list[int], monkeypatch) -> dict[int, int]:
    """(query, key) pairs each layer's eager attention let through, from the mask it received (the
    top-k of DeepSeek-V3.2 folded in), on one packed row of ``docs`` (positions restart per document)."""
    import sys

    calls: dict[int, int] = {}
    for module in model.modules():
        home = sys.modules[type(module).__module__]
        original = getattr(home, "eager_attention_forward", None)
        if original is None or getattr(original, "counting", False):
            continue

        def counting(module, query, key, value, attention_mask, *args, _original=original, **kwargs):
            mask = attention_mask[0, 0, : query.shape[-2], : key.shape[-2]]
            allowed = mask if mask.dtype == torch.bool else mask == 0
            assert module.layer_idx not in calls, "a layer attended twice"
            calls[module.layer_idx] = int(allowed.sum())
            return _original(module, query, key, value, attention_mask, *args, **kwargs)

        counting.counting = True
        monkeypatch.setattr(home, "eager_attention_forward", counting)
    length = sum(docs)
    positions = torch.cat([torch.arange(n) for n in docs]).unsqueeze(0)
    ids = torch.randint(0, model.config.vocab_size, (1, length))
    with torch.no_grad():
        model(input_ids=ids, position_ids=positions, use_cache=False)
    return calls


KINDS_CHECKED = [
    "gemma3n_text",
    "gemma4_text",
    "gemma4_text_moe",
    "olmo3",
    "cohere2",
    "exaone4",
    "smollm3",
    "lfm2",
    "qwen3_5_text",
    "deepseek_v32",
    "glm_moe_dsa",
    "glm4_moe",
    "ministral",
    "granitemoehybrid",
    "falcon_h1",
    "kimi_linear",
]


# transformers 5.25's Granite-4.0-H builds its masks without the packed positions: its documents
# attend to each other in a flattened row (the count per document is what it should do, not what
# it does; the cross-document check of the HF callback is the place that says so).
ROW_NOT_SPLIT = {"granitemoehybrid"}


@pytest.mark.slow
@pytest.mark.parametrize("docs", [[3, 9, 4], [1, 13], [16]], ids=str)
@pytest.mark.parametrize("name", KINDS_CHECKED)
def test_each_layer_attends_the_pairs_of_its_kind(name, docs, monkeypatch):
    """2 · pairs = the kind's sum + the diagonal (docs/flops.md, "Exact pairs"), layer by layer:
    the layer kinds (and DeepSeek-V3.2's top-k as a window) are those the masks really apply."""
    from packscope.core.attention import ATTENTION_SUMS, SLIDING, attention_sums

    spec = spec_from_structure(STRUCTURAL[name])
    pairs = pairs_in_forward(cpu_model(STRUCTURAL[name]), docs, monkeypatch)
    # A model whose mask ignores the documents of a packed row attends it as one sequence.
    docs = [sum(docs)] if name in ROW_NOT_SPLIT else docs
    sums = attention_sums([docs], window=spec.window, chunk=spec.chunk)
    for layer, kind in enumerate(spec.kinds):
        if kind == LINEAR:
            assert layer not in pairs
            continue
        diagonal = sum(min(s, spec.window) for s in docs) if kind == SLIDING else sum(docs)
        assert 2 * pairs[layer] == sums[ATTENTION_SUMS[kind].thd] + diagonal, layer
    assert sorted(pairs) == [i for i, k in enumerate(spec.kinds) if k != LINEAR]


# Hand-written readers whose tiny config the structural count also reads: both agree to the integer.
BOTH = [
    name
    for name in TINY
    # not read by the structural count: a window without layer_types (Mistral, Mixtral, Qwen3-MoE,
    # Qwen2-MoE's rule), GPT-2's Conv1D layers, Llama 4's chunks, the wrappers' towers
    if TINY[name]["model_type"]
    not in ("mistral", "mixtral", "qwen3_moe", "gpt2", "llama4_text", "qwen2_moe", "gemma3", "llama4", "qwen2_5_vl")
]


@pytest.mark.parametrize("name", BOTH)
def test_the_hand_written_and_the_structural_counts_agree_to_the_integer(name):
    cfg = {**TINY[name], "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
    hand = spec_from_hf_dict(cfg)
    structural = spec_from_structure(cfg)
    assert structural.c_lin_by_component == hand.c_lin_by_component
    assert structural.c_core_by_kind == hand.c_core_by_kind
    assert structural.kinds == hand.kinds
    assert (structural.window, structural.chunk) == (hand.window, hand.chunk)


def test_a_deepseek_v32_field_under_deepseek_v3_is_refused_by_name():
    cfg = {**TINY["deepseek_v3"], "index_topk": 2048}
    with pytest.raises(HFConfigError, match="'index_topk'"):
        spec_from_any_hf_dict(cfg)
    with pytest.raises(HFConfigError, match="'index_topk'"):
        spec_from_hf_dict(cfg)  # without transformers too


def test_a_gemma4_field_under_gemma3_text_is_refused_by_name():
    cfg = {**TINY["gemma3_text"], "num_kv_shared_layers": 2}
    with pytest.raises(HFConfigError, match="'num_kv_shared_layers'"):
        spec_from_any_hf_dict(cfg)
    with pytest.raises(HFConfigError, match="'num_kv_shared_layers'"):
        spec_from_hf_dict(cfg)


def test_a_key_the_config_class_does_not_define_is_refused_by_name():
    cfg = {**STRUCTURAL["olmo2"], "moe_every_other_layer": True}
    with pytest.raises(HFConfigError, match="'moe_every_other_layer' is not a field of transformers' Olmo2Config"):
        spec_from_structure(cfg)


def test_a_model_type_transformers_does_not_know_is_refused_in_one_line():
    with pytest.raises(HFConfigError, match=r"unknown model_type 'step3': transformers [\d.]+ has no config class"):
        spec_from_structure({"model_type": "step3", "hidden_size": 8})


def test_mllamas_decoder_alone_or_without_its_tower_is_refused_in_one_line():
    """mllama's cross-attention layers read its tower's tokens: transformers builds no causal LM from
    its text config alone, and a wrapper without vision_config would be transformers' default tower;
    the wrapper with its tower is counted (tests/agent/test_mllama.py)."""
    text = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 3}
    text |= {"intermediate_size": 48, "vocab_size": 300, "cross_attention_layers": [1]}
    for cfg, message in [
        ({**text, "model_type": "mllama_text_model"}, "mllama_text_model: transformers builds no causal LM"),
        ({"model_type": "mllama", "text_config": text}, "'vision_config' is missing"),
    ]:
        with pytest.raises(HFConfigError, match=message) as caught:
            spec_from_structure(cfg)
        assert "\n" not in str(caught.value)


def test_gemma4_attending_both_ways_everywhere_is_refused_by_name():
    """use_bidirectional_attention 'all': every pair of a document, not the causal half; 'vision' on
    text alone is causal (the pairs test holds the gemma4_text fixture, which sets it, to the masks)."""
    with pytest.raises(HFConfigError, match="use_bidirectional_attention 'all'"):
        spec_from_structure({**STRUCTURAL["gemma4_text"], "use_bidirectional_attention": "all"})


def test_gemma3n_published_text_config_keys_are_read():
    """Keys Gemma 3n's published text_config carries (E4B's layout, as older transformers wrote it)
    and 5.25's class dropped change no GEMM: counted, the same as without them."""
    published = {
        **STRUCTURAL["gemma3n_text"],
        "rope_local_base_freq": 10000.0,
        "rope_theta": 1000000.0,
        "query_pre_attn_scalar": 256,
        "altup_lr_multiplier": 1.0,
        "final_logit_softcapping": 30.0,
    }
    assert spec_from_structure(published) == spec_from_structure(STRUCTURAL["gemma3n_text"])


def test_fused_expert_weights_no_part_reads_are_refused_by_name():
    """A layer child holding 3-D expert weights and no nn.Linear (Gemma 4's layer-level experts, were
    nothing to read them) is work the walk would drop: refused, not counted as nothing."""
    from packscope.agent.hf_structure import measure

    model = cpu_model(STRUCTURAL["olmo2"])
    experts = nn.Module()
    experts.gate_up_proj = nn.Parameter(torch.zeros(4, 32, 32))
    model.model.layers[0].experts = experts
    with pytest.raises(HFConfigError, match=r"layer part 'experts' \(Module\) holds GEMMs"):
        measure(model, model.config)


def test_gemma_parts_by_hand():
    """The tiny Gemma 3n's AltUp, Laurel and per-layer inputs, and the Gemma 4 MoE's experts and dense
    MLP, from the config's sizes (the forward's counts are the other check)."""
    g = STRUCTURAL["gemma3n_text"]
    h, n, r, p, layers = g["hidden_size"], g["altup_num_inputs"], g["laurel_rank"], 8, g["num_hidden_layers"]
    assert spec_from_structure(g).ffn == g["intermediate_size"][0]  # shown: the first layer's of a list
    spec = spec_from_structure(g).c_lin_by_component
    # per layer: the router twice, n → n², n → n, the n x n mixing of h; beside: 2 (n - 1) h x h
    assert spec["altup"] == 6 * (layers * (2 * h * n + n**3 + n**2 + h * n * n) + 2 * (n - 1) * h * h)
    assert spec["laurel"] == 6 * layers * 2 * h * r
    assert spec["per_layer_inputs"] == 6 * (h * layers * p + layers * 2 * h * p)
    moe = STRUCTURAL["gemma4_text_moe"]
    spec = spec_from_structure(moe).c_lin_by_component
    assert spec["moe_routed"] == 6 * layers * moe["top_k_experts"] * 3 * h * moe["moe_intermediate_size"]
    assert spec["moe_shared"] == 6 * layers * 3 * h * moe["intermediate_size"]
    assert spec["dense_mlp"] == 0 and spec["per_layer_inputs"] == 0


@pytest.mark.parametrize("name", DSA)
def test_sparse_attention_counts_its_top_k_as_a_window_and_its_indexer_as_full_pairs(name):
    """The top-k keys of each query are the pairs of a window of index_topk; the indexer scores every
    causal pair (q·k per index head, then the head weights), forward only (transformers runs it
    without grad), so its projections cost 2 FLOPs per multiply-add."""
    cfg = STRUCTURAL[name]
    spec = spec_from_structure(cfg)
    assert spec.window == cfg["index_topk"]
    assert set(spec.kinds) == {"sliding"}
    heads, layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]
    width = heads * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] + cfg["v_head_dim"])
    indexer = cfg["index_n_heads"] * (cfg["index_head_dim"] + 1)
    assert spec.c_core_by_kind == {"sliding": 3 * width * layers, "full": indexer * layers}
    model = cpu_model(cfg)
    runs = [counted_forward(model, n) for n in LENGTHS]
    indexer_macs = sum(
        (
            runs[1].get(f"model.layers.{i}.self_attn.indexer.{p}", {}).get("aten.mm", 0)
            - runs[0].get(f"model.layers.{i}.self_attn.indexer.{p}", {}).get("aten.mm", 0)
        )
        / (LENGTHS[1] - LENGTHS[0])
        / 2
        for i in range(layers)
        for p in ("wq_b", "wk", "weights_proj")
    )
    oracle = oracle_gemm_macs(model)
    expected = 6 * (oracle["attention"] - indexer_macs) + 2 * indexer_macs
    assert spec.c_lin_by_component["attention"] == pytest.approx(expected, rel=1e-3)
    for key, macs in oracle.items():  # the MLPs and the head as every other model's
        if key != "attention":
            assert spec.c_lin_by_component[key] == pytest.approx(6 * macs, rel=1e-3), key


def test_a_measured_model_survives_the_wire_dict():
    from packscope.core.flops import ModelSpec

    spec = spec_from_structure(STRUCTURAL["qwen3_5_moe_text"])
    back = ModelSpec.from_dict(spec.to_dict())
    assert back.c_lin_by_component == spec.c_lin_by_component
    assert back.c_core_by_kind == spec.c_core_by_kind


def test_the_cli_reads_a_type_without_a_hand_written_reader_through_its_structure(tmp_path):
    """A DeepSeek-V3 config relabelled deepseek_v2 (no hand-written reader): the CLI's reader goes to
    the structure, which refuses the V3 field DeepseekV2Config lacks (moe_layer_freq), by name; the core alone says
    it has no reader."""
    import json
    from pathlib import Path

    from packscope.commands.flops import read_model

    published = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "published" / "deepseek_v3.json"
    cfg = {**json.loads(published.read_text()), "model_type": "deepseek_v2"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(HFConfigError, match="'moe_layer_freq' is not a field of transformers' DeepseekV2Config"):
        read_model(str(path), tp=1)
    with pytest.raises(HFConfigError, match="DeepSeek-V2's MoE layer rule is not read yet"):
        spec_from_hf_dict(cfg)
    path.write_text(json.dumps(STRUCTURAL["olmo3"]))
    assert read_model(str(path), tp=1) == spec_from_structure(STRUCTURAL["olmo3"])


def test_without_transformers_a_type_with_no_hand_written_reader_says_to_install_it(tmp_path, monkeypatch):
    import json
    import sys

    from packscope.commands.flops import read_model

    monkeypatch.setitem(sys.modules, "packscope.agent.hf_structure", None)  # as if torch were missing
    path = tmp_path / "config.json"
    path.write_text(json.dumps(STRUCTURAL["olmo2"]))
    with pytest.raises(HFConfigError, match=r"unknown model_type 'olmo2'.*install transformers and torch"):
        read_model(str(path), tp=1)


def test_an_over_deep_json_file_and_an_empty_vision_config_are_one_line_errors(tmp_path):
    import json

    from packscope.commands.flops import read_model

    path = tmp_path / "config.json"
    path.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(HFConfigError, match="nests too deeply"):
        read_model(str(path), tp=1)
    path.write_text(json.dumps({**TINY["gemma3"], "vision_config": {}}))
    with pytest.raises(HFConfigError, match="'vision_config' is empty"):
        read_model(str(path), tp=1)


@pytest.mark.parametrize("name", CONFIGS)
def test_the_cli_the_python_api_and_the_hf_callback_agree(name, tmp_path):
    """The CLI's reader (a file), the Python API (a file, a dict) and the callback's (``model.config``,
    a loaded transformers config) give the same model, coefficient for coefficient (a wrapper's
    tower included: ModelSpec compares its ``vision``)."""
    import json

    from packscope.agent import read_any_hf_config, spec_from_any_hf_config
    from packscope.commands.flops import read_model

    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS[name]))
    cfg = dict(CONFIGS[name])
    loaded = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    specs = [read_model(str(path), tp=1), read_any_hf_config(path), spec_from_any_hf_config(loaded)]
    reference = spec_from_structure(CONFIGS[name])
    for spec in specs:
        assert spec == reference
        assert (spec.c_lin_by_component, spec.c_core_by_kind) == (
            reference.c_lin_by_component,
            reference.c_core_by_kind,
        )


def test_a_missing_core_size_takes_transformers_default_with_a_notice(caplog):
    cfg = {k: v for k, v in STRUCTURAL["olmo2"].items() if k != "intermediate_size"}
    with caplog.at_level("WARNING", logger="packscope.agent.hf_structure"):
        spec = spec_from_structure(cfg)
    notices = [r.getMessage() for r in caplog.records]
    default = AutoConfig.for_model("olmo2").intermediate_size
    assert notices == [
        f"packscope FLOPs: config.json has no 'intermediate_size'; using transformers' default {default}"
    ]
    assert spec.c_lin_by_component["dense_mlp"] == 6 * 3 * 32 * default * 2


def test_packscope_flops_counts_a_structural_model_and_exits_0(tmp_path, capsys):
    import json

    from packscope.commands.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(STRUCTURAL["olmo3"]))
    assert main(["flops", "--hf-config", str(path), "--pack", "3,9,4", "--pack-length", "16"]) == 0
    out = json.loads(capsys.readouterr().out)
    spec = spec_from_structure(STRUCTURAL["olmo3"])
    assert out["c_lin"] == spec.c_lin and out["c_core_by_kind"] == spec.c_core_by_kind
    assert out["flops_thd"] == spec.triad_by_kind(16, 16, out["sums"])["thd"]


def test_a_gemm_outside_the_layers_and_the_head_is_refused_by_name():
    from packscope.agent.hf_structure import measure

    model = cpu_model(STRUCTURAL["olmo2"])
    measure(model, model.config)  # as built: every GEMM placed
    model.model.per_layer_model_projection = nn.Linear(32, 64)  # as Gemma 4 has one beside its layers
    with pytest.raises(HFConfigError, match=r"module 'model\.per_layer_model_projection' \(Linear\) runs outside"):
        measure(model, model.config)


PUBLISHED = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "published"
# Published configs the structural count reads; the others it refuses by name (a field transformers'
# class drops: DeepSeek-V3's moe_layer_freq, Gemma 2's sliding_window_size, GPT-OSS's
# experts_per_token; a window without layer_types: Mistral; a vision tower).
BOTH_PUBLISHED = [
    "gemma3_12b_text.json",
    "llama3_1_70b.json",
    "llama3_1_8b.json",
    "mixtral_8x7b.json",
    "qwen2_5_7b.json",
    "qwen3_30b_a3b.json",
    "qwen3_8b.json",
]


@pytest.mark.parametrize("fixture", sorted(p.name for p in PUBLISHED.glob("*.json")))
def test_on_published_configs_both_counts_agree_to_the_integer_or_the_structure_refuses(fixture):
    import json

    cfg = json.loads((PUBLISHED / fixture).read_text())
    hand = spec_from_hf_dict(cfg)
    if fixture not in BOTH_PUBLISHED:
        with pytest.raises(HFConfigError):
            spec_from_structure(cfg)
        return
    structural = spec_from_structure(cfg)
    assert structural.c_lin_by_component == hand.c_lin_by_component
    assert structural.c_core_by_kind == hand.c_core_by_kind
    assert (structural.kinds, structural.window, structural.chunk) == (hand.kinds, hand.window, hand.chunk)


@pytest.mark.parametrize("fixture", sorted(p.name for p in PUBLISHED.glob("*.json")))
def test_the_callback_reads_a_published_config_as_the_cli_does(fixture):
    import json

    from packscope.agent import spec_from_any_hf_config

    cfg = json.loads((PUBLISHED / fixture).read_text())
    assert spec_from_any_hf_config(cfg) == spec_from_hf_dict(cfg)


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"model_type": "step3p5"}, "step3p5: transformers builds no causal LM from it"),
        ({"model_type": "granitemoehybrid", "mamba_n_heads": 3}, "refuses it"),
        ({"model_type": "ministral", **STRUCTURAL["ministral"], "head_dim": None}, "could not build the model"),
    ],
)
def test_what_transformers_refuses_is_one_line(cfg, message):
    with pytest.raises(HFConfigError, match=message) as caught:
        spec_from_structure({**cfg, "model_type": cfg["model_type"]})
    assert "\n" not in str(caught.value)
