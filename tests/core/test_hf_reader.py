"""The Hugging Face reader: strict fields, transformers' defaults, the layer rules of each family,
multimodal wrappers, and ``packscope flops`` exiting 2 with a one-line message for a bad config
(run in-process through the CLI entry point)."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from packscope.commands.cli import main
from packscope.core.hf_config import HFConfigError, read_hf_config, spec_from_hf_config, spec_from_hf_dict

PUBLISHED = Path(__file__).parent.parent / "fixtures" / "hf" / "published"


def published(name: str) -> dict[str, Any]:
    return json.loads((PUBLISHED / name).read_text())


def changed(name: str, path: str, value: Any) -> dict[str, Any]:
    """A published config with one field set (``text_config.x`` for a wrapper's decoder);
    ``value=DELETE`` removes it."""
    cfg = copy.deepcopy(published(name))
    where = cfg
    *parents, key = path.split(".")
    for p in parents:
        where = where[p]
    if value is DELETE:
        where.pop(key)
    else:
        where[key] = value
    return cfg


DELETE = object()


def run_flops(tmp_path: Path, cfg: dict[str, Any], capsys, *packs: str) -> tuple[int, str, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    args = ["flops", "--hf-config", str(path)]
    for p in packs or ("3000,9000",):
        args += ["--pack", p]
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


# Every bad config of the issue, and the other fields that would change the count unread.
BAD = [
    ("llama3_1_8b.json", "hidden_size", "4096", "'hidden_size' must be an integer, got '4096'"),
    ("llama3_1_8b.json", "num_hidden_layers", 32.5, "'num_hidden_layers' must be an integer, got 32.5"),
    ("llama3_1_8b.json", "num_hidden_layers", True, "'num_hidden_layers' must be an integer, got True"),
    ("llama3_1_8b.json", "num_hidden_layers", 0, "'num_hidden_layers' must be an integer from 1"),
    ("llama3_1_8b.json", "num_key_value_heads", 0, "'num_key_value_heads' must be an integer from 1"),
    ("llama3_1_8b.json", "num_key_value_heads", 5, "'num_key_value_heads' (5) must divide num_attention_heads"),
    ("llama3_1_8b.json", "head_dim", 0, "'head_dim' must be an integer from 1"),
    ("llama3_1_8b.json", "num_attention_heads", 24, "'head_dim' is not given and hidden_size (4096) is not a multiple"),
    ("llama3_1_8b.json", "vocab_size", -1, "'vocab_size' must be an integer from 1"),
    ("llama3_1_8b.json", "sliding_window", 4096, "'sliding_window' is set (4096) but packscope does not read it"),
    ("llama3_1_8b.json", "attention_chunk_size", 8192, "'attention_chunk_size' is set (8192) but packscope does not"),
    ("llama3_1_8b.json", "num_local_experts", 8, "'num_local_experts' is set (8)"),
    ("mistral_7b_v0_1.json", "layer_types", ["full_attention"] * 32, "'layer_types' is set"),
    ("mistral_7b_v0_1.json", "sliding_window", [4096, 1024], "'sliding_window' must be an integer, got [4096, 1024]"),
    ("mixtral_8x7b.json", "num_experts", 4, "'num_local_experts' is given under several names"),
    ("qwen2_5_7b.json", "layer_types", ["full_attention"] * 27, "'layer_types' has 27 entries for 28 layers"),
    ("qwen2_5_7b.json", "layer_types", ["sliding_attention"] * 28, "use_sliding_window is false"),
    ("qwen2_5_7b.json", "use_sliding_window", "yes", "'use_sliding_window' must be true or false"),
    ("qwen3_30b_a3b.json", "use_sliding_window", True, "'sliding_window' must be an integer >= 1 when"),
    ("qwen3_30b_a3b.json", "num_experts_per_tok", 200, "'num_experts_per_tok' (200) is more than the 128 experts"),
    ("gemma2_9b.json", "layer_types", ["local_attention"] * 42, "entry 0 is 'local_attention'"),
    ("gemma2_9b.json", "sliding_window_size", 2048, "'sliding_window_size' (2048) differs from sliding_window"),
    ("gemma3_12b.json", "text_config.use_bidirectional_attention", True, "bidirectional attention is not counted"),
    ("gemma3_12b.json", "text_config.model_type", "llama", "'text_config.model_type' must be gemma3_text"),
    ("gemma3_12b.json", "text_config", [1], "'text_config' must be an object"),
    ("gemma3_12b.json", "text_config.sliding_window", None, "'text_config.sliding_window' must be an integer"),
    ("gpt_oss_20b.json", "experts_per_token", 2, "'experts_per_token' (2) differs from num_experts_per_tok (4)"),
    (
        "llama4_scout_17b_16e.json",
        "text_config.no_rope_layers",
        [1, 0],
        "'text_config.no_rope_layers' must hold one 0/1 flag",
    ),
    ("llama4_scout_17b_16e.json", "text_config.moe_layers", [0, 48], "lists a layer beyond the 48 layers"),
    ("deepseek_v3.json", "moe_layer_freq", 2, "'moe_layer_freq' is not 1"),
    ("deepseek_v3.json", "num_key_value_heads", 1, "must equal num_attention_heads (128) for MLA"),
    ("deepseek_v3.json", "kv_lora_rank", None, "'kv_lora_rank' must be an integer, got None"),
    ("deepseek_v3.json", "num_mtp_layers", 2, "given under several names"),
    ("llama3_1_8b.json", "model_type", "nemotron_h", "Mamba-2 layers"),
    ("llama3_1_8b.json", "model_type", "bert_xyz", "unknown model_type 'bert_xyz'"),
    ("llama3_1_8b.json", "model_type", DELETE, "config.json has no 'model_type' (architectures: LlamaForCausalLM)"),
]


@pytest.mark.parametrize("name,path,value,message", BAD, ids=lambda x: x if isinstance(x, str) else None)
def test_a_bad_config_exits_2_naming_the_field(tmp_path, capsys, name, path, value, message):
    rc, out, err = run_flops(tmp_path, changed(name, path, value), capsys)
    assert rc == 2 and out == ""
    assert err.startswith("packscope flops: error: ") and err.count("\n") == 1, err
    assert message in err
    with pytest.raises(HFConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        spec_from_hf_dict(changed(name, path, value))


@pytest.mark.parametrize("name", sorted(p.name for p in PUBLISHED.glob("*.json")))
def test_every_published_config_is_read_by_the_cli_and_the_api_alike(tmp_path, capsys, name):
    rc, out, err = run_flops(tmp_path, published(name), capsys, "3000,9000", "12000")
    assert rc == 0, err
    report = json.loads(out)
    m = read_hf_config(PUBLISHED / name)
    assert (report["c_lin"], report["c_core"]) == (m.c_lin, m.c_core)
    assert report["c_core_by_kind"] == m.c_core_by_kind
    assert report["not_counted"] == list(m.not_counted)
    for view in ("bshd", "thd", "useful"):
        assert sum(report["flops_split"][view].values()) == report[f"flops_{view}"]


def test_the_cli_shows_the_per_kind_sums(tmp_path, capsys):
    rc, out, _ = run_flops(tmp_path, published("gemma3_12b.json"), capsys, "512,3000", "4096")
    report = json.loads(out)
    assert rc == 0 and report["layers_by_kind"] == {"full": 8, "sliding": 40} and report["window"] == 1024
    assert report["sums"] == {
        "seqlen_sq_sum_thd": 512**2 + 3000**2 + 4096**2,
        "seqlen_sq_sum_bshd": 2 * 4096**2,
        "window_sq_sum_thd": 512**2 + (2 * 3000 * 1024 - 1024**2) + (2 * 4096 * 1024 - 1024**2),
        "window_sq_sum_bshd": 2 * (2 * 4096 * 1024 - 1024**2),
    }
    assert set(report["flops_split"]["thd"]) == {"linear", "full", "sliding"}


def test_absent_fields_take_transformers_defaults():
    # Qwen3 without head_dim: transformers' Qwen3Config gives 128, not hidden / heads (= 64 here).
    qwen3 = {k: v for k, v in published("qwen3_8b.json").items() if k != "head_dim"}
    qwen3.update(hidden_size=2048, num_attention_heads=32)
    assert spec_from_hf_dict(qwen3).head_dim == 128
    # Qwen2 without num_key_value_heads: Qwen2Config's default is 32, not the heads.
    qwen2 = {k: v for k, v in published("qwen2_5_7b.json").items() if k != "num_key_value_heads"}
    qwen2.update(num_attention_heads=64, hidden_size=4096)
    assert spec_from_hf_dict(qwen2).kv_heads == 32
    # Gemma 3's published text_config leaves out head_dim (256) and the vocabulary (262208).
    gemma = spec_from_hf_dict(published("gemma3_12b.json"))
    assert (gemma.head_dim, gemma.vocab, gemma.window) == (256, 262208, 1024)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen2_moe"])
def test_num_experts_zero_makes_a_dense_model(model_type):
    """transformers' Qwen MoE layers need num_experts > 0; with 0 every layer is a dense MLP."""
    cfg = dict(changed("qwen3_30b_a3b.json", "num_experts", 0), model_type=model_type)
    m = spec_from_hf_dict(cfg)
    moe_fields = (
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "decoder_sparse_step",
        "mlp_only_layers",
        "shared_expert_intermediate_size",
    )
    dense = spec_from_hf_dict({**{k: v for k, v in cfg.items() if k not in moe_fields}, "model_type": "qwen3"})
    assert m.moe_layer_count == 0 and m.c_lin == dense.c_lin


def test_qwen_sliding_window_rules():
    base = dict(published("qwen2_5_7b.json"), num_hidden_layers=6, use_sliding_window=True, sliding_window=4096)
    m = spec_from_hf_dict({**base, "max_window_layers": 4})
    assert m.kinds == ("full",) * 4 + ("sliding",) * 2 and m.window == 4096  # layers from max_window_layers on
    moe = spec_from_hf_dict({**base, "model_type": "qwen2_moe", "max_window_layers": 4, "num_experts": 8})
    assert moe.kinds == ("sliding", "full", "sliding", "full", "full", "full")  # even layers below it
    q3moe = spec_from_hf_dict({**published("qwen3_30b_a3b.json"), "use_sliding_window": True, "sliding_window": 8192})
    assert set(q3moe.kinds) == {"sliding"}
    explicit = spec_from_hf_dict({**base, "layer_types": ["sliding_attention", "full_attention"] * 3})
    assert explicit.kinds == ("sliding", "full") * 3
    off = spec_from_hf_dict(published("qwen2_5_7b.json"))  # sliding_window 131072, use_sliding_window false
    assert set(off.kinds) == {"full"} and off.window is None


def test_mixtral_with_a_window_and_llama4_defaults():
    assert spec_from_hf_dict(changed("mixtral_8x7b.json", "sliding_window", 4096)).kinds == ("sliding",) * 32
    scout = changed("llama4_scout_17b_16e.json", "text_config.no_rope_layers", [])
    m = spec_from_hf_dict(scout)  # [] means transformers' default: every 4th layer NoPE (full)
    assert m.kinds == ("chunked", "chunked", "chunked", "full") * 12 and m.chunk == 8192
    maverick = changed("llama4_scout_17b_16e.json", "text_config.interleave_moe_layer_step", 2)
    assert spec_from_hf_dict(maverick).moe_layers == (0, 1) * 24
    # No chunk size: transformers makes every layer full attention; named chunked layers need one.
    unchunked = changed("llama4_scout_17b_16e.json", "text_config.attention_chunk_size", None)
    assert set(spec_from_hf_dict(unchunked).kinds) == {"full"}
    unchunked["text_config"]["layer_types"] = ["chunked_attention"] * 48
    with pytest.raises(HFConfigError, match="chunked_attention layers but attention_chunk_size is null"):
        spec_from_hf_dict(unchunked)


def test_text_model_types_are_accepted_alone():
    # The wrapper's decoder is the text model; the wrapper adds its tower (ModelSpec.vision).
    text = published("gemma3_12b.json")["text_config"]
    wrapped = spec_from_hf_dict(published("gemma3_12b.json"))
    assert spec_from_hf_dict(text) == dataclasses.replace(wrapped, vision=None) and wrapped.vision is not None
    llama4_text = published("llama4_scout_17b_16e.json")["text_config"]
    assert spec_from_hf_dict(llama4_text).c_lin == spec_from_hf_dict(published("llama4_scout_17b_16e.json")).c_lin
    vl = published("qwen2_5_vl_7b.json")
    flat_text = {k: v for k, v in vl.items() if k not in ("vision_config", "model_type")}
    from_vl = spec_from_hf_dict(vl)
    assert spec_from_hf_dict({**flat_text, "model_type": "qwen2_5_vl_text"}) == dataclasses.replace(
        from_vl, vision=None
    )
    nested = {
        "model_type": "qwen2_5_vl",
        "text_config": {**flat_text, "model_type": "qwen2_5_vl_text"},
        "vision_config": vl["vision_config"],
    }
    assert spec_from_hf_dict(nested) == from_vl


def test_a_multimodal_config_counts_its_tower_and_names_what_runs_unused(caplog):
    m = spec_from_hf_dict(published("gemma3_12b.json"))
    assert m.vision is not None and m.vision.tower == "siglip" and m.not_counted == ()
    assert spec_from_hf_dict(published("gemma3_12b_text.json")).not_counted == ()
    with_head = changed("gemma3_12b.json", "vision_config.vision_use_head", True)
    with caplog.at_level(logging.WARNING, logger="packscope.core.hf_config"):
        m = spec_from_hf_dict(with_head)
    assert m.not_counted == ("the SigLIP attention-pooling head (vision_use_head): run forward, its output unused",)
    assert "not counted: the SigLIP attention-pooling head" in caplog.text


def test_spec_from_hf_config_reads_an_object_through_to_dict():
    class Loaded:
        def to_dict(self) -> dict[str, Any]:
            return published("gpt_oss_20b.json")

    assert spec_from_hf_config(Loaded()) == read_hf_config(PUBLISHED / "gpt_oss_20b.json")
    with pytest.raises(HFConfigError, match="expected a transformers config or a dict"):
        spec_from_hf_config(42)
    with pytest.raises(HFConfigError, match="tp must be an integer"):
        spec_from_hf_dict(published("gpt_oss_20b.json"), tp=True)  # type: ignore[arg-type]


def test_kimi_k2_is_read_as_deepseek_v3():
    """Kimi-K2 ships model_type kimi_k2 with DeepseekV3ForCausalLM's architecture (384 experts,
    64 heads, one dense layer, no MTP module)."""
    kimi = dict(
        published("deepseek_v3.json"),
        model_type="kimi_k2",
        architectures=["DeepseekV3ForCausalLM"],
        n_routed_experts=384,
        num_attention_heads=64,
        num_key_value_heads=64,
        first_k_dense_replace=1,
        num_nextn_predict_layers=0,
        vocab_size=163840,
    )
    m = spec_from_hf_dict(kimi)
    assert m == spec_from_hf_dict({**kimi, "model_type": "deepseek_v3"})
    assert (m.mla is not None, m.moe_layers[:2], m.mtp_depth, m.heads) == (True, (0, 1), 0, 64)


def test_a_missing_core_size_takes_transformers_default_with_a_one_line_notice(caplog):
    from packscope.core.hf_config import spec_from_hf_dict
    from packscope.core.hf_defaults import DEFAULTS

    cfg = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 96}
    with caplog.at_level("WARNING", logger="packscope.core.hf_config"):
        spec = spec_from_hf_dict(cfg)
    default = DEFAULTS["llama"]["intermediate_size"]
    assert [r.getMessage() for r in caplog.records] == [
        f"packscope FLOPs: config.json has no 'intermediate_size'; using transformers' default {default}"
    ]
    assert spec.ffn == default
