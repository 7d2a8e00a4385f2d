"""packscope.core.hf_defaults against the installed transformers: every default the readers use is
the one transformers' config class gives (or, where we say a field is not one of its fields, it
is not)."""

from __future__ import annotations

import dataclasses

import pytest

from packscope.core.hf_defaults import DEFAULTS

transformers = pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

# Defaults of __post_init__ kwargs rather than of dataclass fields, checked through their effect.
KWARGS_DEFAULTS = {("gemma3_text", "sliding_window_pattern"), ("qwen3_next", "full_attention_interval")}
# Fields we read that the config class does not declare (a checkpoint may still carry them).
NOT_FIELDS = {
    ("qwen2", "head_dim"),
    ("qwen2_moe", "head_dim"),
    ("qwen3_moe", "head_dim"),
    ("qwen3_moe", "max_window_layers"),
    ("qwen2_5_vl_text", "head_dim"),
    ("gemma2", "sliding_window_size"),
    ("gpt_oss", "experts_per_token"),
    ("deepseek_v3", "moe_layer_freq"),
    ("qwen3_next", "mtp_num_hidden_layers"),
}
CASES = [(mt, key) for mt, table in DEFAULTS.items() if mt != "kimi_k2" for key in table]


def field_defaults(model_type: str) -> dict[str, object]:
    cls = CONFIG_MAPPING[model_type]
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


@pytest.mark.parametrize("model_type,key", CASES)
def test_each_default_is_transformers_own(model_type, key):
    ours = DEFAULTS[model_type][key]
    declared = field_defaults(model_type)
    if (model_type, key) in KWARGS_DEFAULTS:
        assert key not in declared
        return
    if (model_type, key) in NOT_FIELDS:
        assert key not in declared
        # Absent means off, except DeepSeek's moe_layer_freq: 1, the default of DeepSeek's own config.
        assert ours == (1 if key == "moe_layer_freq" else None)
        return
    assert key in declared, f"{model_type} has no field {key}"
    assert declared[key] == ours


def test_kwargs_defaults_by_their_effect():
    gemma3 = CONFIG_MAPPING["gemma3_text"](num_hidden_layers=12)
    pattern = DEFAULTS["gemma3_text"]["sliding_window_pattern"]
    assert gemma3.layer_types == ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(12)]
    nxt = CONFIG_MAPPING["qwen3_next"](num_hidden_layers=8)
    interval = DEFAULTS["qwen3_next"]["full_attention_interval"]
    assert nxt.layer_types == ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(8)]


def test_the_derived_defaults():
    """None in the table means transformers derives the value: head_dim from hidden / heads and
    num_key_value_heads from heads (Llama), the model's own behaviour we follow."""
    llama = CONFIG_MAPPING["llama"](hidden_size=96, num_attention_heads=4)
    assert (llama.head_dim, llama.num_key_value_heads) == (24, 4)
