"""packscope.core.hf_defaults' vision tables against the installed transformers: every default the
vision readers use is the one the tower's (or the wrapper's) config class gives."""

from __future__ import annotations

import dataclasses

import pytest

from packscope.core.hf_defaults import VISION_DEFAULTS, WRAPPER_DEFAULTS

pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

CLASSES = {"qwen2_5_vl_vision": Qwen2_5_VLVisionConfig}  # not in CONFIG_MAPPING: a sub-config only
CASES = [(table, mt, key) for table in (VISION_DEFAULTS, WRAPPER_DEFAULTS) for mt in table for key in table[mt]]


def declared(model_type: str) -> dict[str, object]:
    cls = CLASSES.get(model_type) or CONFIG_MAPPING[model_type]
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


@pytest.mark.parametrize("table,model_type,key", CASES, ids=lambda x: x if isinstance(x, str) else None)
def test_each_vision_default_is_transformers_own(table, model_type, key):
    theirs = declared(model_type)
    assert key in theirs, f"{model_type} has no field {key}"
    value = theirs[key]
    assert (list(value) if isinstance(value, tuple) else value) == table[model_type][key]


def test_pixtral_attention_takes_hidden_over_heads():
    """Why the reader takes Pixtral's head width as hidden / heads (and refuses another head_dim): the
    attention module computes it so, whatever the config's head_dim says."""
    from transformers.models.pixtral.modeling_pixtral import PixtralAttention

    config = CONFIG_MAPPING["pixtral"](hidden_size=64, num_attention_heads=4, head_dim=128)
    assert (config.head_dim, PixtralAttention(config).head_dim) == (128, 16)
