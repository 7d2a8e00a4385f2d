"""Read a Hugging Face ``config.json``, or a loaded config object, into a :class:`ModelSpec`
(docs/flops.md, "Hugging Face config.json").

The count is that of the model transformers builds from the file: absent fields take the
installed transformers' defaults (``hf_defaults``), present ones are type-checked strictly, and
a field that would change the count but that we do not understand is an error naming it, as is
an architecture we do not know. A multimodal config is read through its decoder (``text_config``,
or the flat fields where the checkpoint keeps them flat) and its vision tower (``vision_config``,
``hf_vision``) into ``ModelSpec.vision``; what a tower runs but the count leaves out is named in
``ModelSpec.not_counted`` and a logged warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packscope.core.flops import ModelSpec
from packscope.core.hf_arch import READERS
from packscope.core.hf_defaults import DEFAULTS
from packscope.core.hf_fields import ConfigFields, HFConfigError, UnknownModelType
from packscope.core.hf_vision import read_vision

log = logging.getLogger(__name__)

# Multimodal wrappers: the decoder's model_type when text_config does not name one, and the text
# model types transformers accepts there. Their vision towers are read by packscope.core.hf_vision.
WRAPPERS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "gemma3": ("gemma3_text", ("gemma3_text",)),
    "llama4": ("llama4_text", ("llama4_text",)),
    "qwen2_5_vl": ("qwen2_5_vl_text", ("qwen2_5_vl_text",)),
    "mistral3": ("mistral", None),
    "llava": ("llama", None),
}
KNOWN = sorted(set(READERS) | set(WRAPPERS))
_VLMS = ", ".join(sorted(WRAPPERS))
_REFUSED = {
    "nemotron_h": "its Mamba-2 layers and its attention-only and MLP-only blocks (hybrid_override_pattern) "
    "are not counted yet",
    "mamba": "state-space (Mamba) layers are not counted yet",
    "mamba2": "state-space (Mamba-2) layers are not counted yet",
    "deepseek_v2": "DeepSeek-V2's MoE layer rule is not read yet (DeepSeek-V3's is: model_type deepseek_v3)",
    **dict.fromkeys(
        (
            "qwen2_vl",
            "llava_next",
            "llava_onevision",
            "paligemma",
            "idefics3",
            "smolvlm",
        ),
        f"its vision tower (vision_config) is not counted yet; vision-language models counted: {_VLMS}",
    ),
    # Counted by the structural count (packscope.agent.hf_structure), which reads the tower's modules.
    **dict.fromkeys(
        ("qwen3_vl", "qwen3_vl_moe", "internvl", "mllama", "gemma3n"),
        f"no hand-written reader counts its vision tower (those counted: {_VLMS}); the count from the "
        "model's structure does",
    ),
}


# Refused whatever reads them: their layers have no price yet (state-space scans).
_UNPRICED = ("nemotron_h", "mamba", "mamba2")


def _largest_pow2_divisor(v: int, cap: int = 128) -> int:
    div = 1
    while div < cap and v % (div * 2) == 0:
        div *= 2
    return div


def model_type(cfg: Mapping[str, Any]) -> str:
    mt = cfg.get("model_type")
    if mt is None:
        archs = cfg.get("architectures") or []
        raise HFConfigError(
            "config.json has no 'model_type'"
            + (f" (architectures: {', '.join(map(str, archs))})" if isinstance(archs, list) and archs else "")
            + f"; known model types: {', '.join(KNOWN)}"
        )
    if not isinstance(mt, str):
        raise HFConfigError(f"config.json: 'model_type' must be a string, got {mt!r}")
    if mt in _UNPRICED:
        raise HFConfigError(f"model_type {mt!r} is not supported: {_REFUSED[mt]}")
    if mt in _REFUSED:  # transformers' own structure may still be read (packscope.agent.hf_structure)
        raise UnknownModelType(f"model_type {mt!r} is not supported: {_REFUSED[mt]}")
    if mt not in KNOWN:
        raise UnknownModelType(f"unknown model_type {mt!r}; known model types: {', '.join(KNOWN)}")
    return mt


def _decoder(cfg: Mapping[str, Any], mt: str) -> tuple[Mapping[str, Any], str, str]:
    """The decoder's fields, model_type and path prefix."""
    if mt not in WRAPPERS:
        return cfg, mt, ""
    default_type, allowed = WRAPPERS[mt]
    if "text_config" not in cfg and mt == "qwen2_5_vl":  # Qwen2.5-VL checkpoints keep the decoder flat
        return cfg, default_type, ""
    text = cfg.get("text_config") or {}
    if not isinstance(text, Mapping):
        raise HFConfigError(f"{mt} config.json: 'text_config' must be an object, got {text!r}")
    text_type = text.get("model_type", default_type)
    if not isinstance(text_type, str) or text_type in WRAPPERS or text_type not in READERS:
        raise HFConfigError(f"{mt} config.json: 'text_config.model_type' {text_type!r} is not a decoder we read")
    if allowed is not None and text_type not in allowed:
        raise HFConfigError(
            f"{mt} config.json: 'text_config.model_type' must be {' or '.join(allowed)}, got {text_type!r}"
        )
    return text, text_type, "text_config."


def spec_from_hf_dict(cfg: Mapping[str, Any], tp: int = 1) -> ModelSpec:
    """A :class:`ModelSpec` from a config.json dict (a wrapper's ``text_config`` unwrapped)."""
    if not isinstance(cfg, Mapping):
        raise HFConfigError(f"a config is a JSON object, got {type(cfg).__name__}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise HFConfigError(f"tp must be an integer >= 1, got {tp!r}")
    mt = model_type(cfg)
    text, text_type, where = _decoder(cfg, mt)
    fields = ConfigFields(text, text_type, DEFAULTS[text_type], where)
    args = READERS[text_type](fields)
    fields.refuse_unread()
    for key, value in fields.defaulted.items():
        log.warning("packscope FLOPs: config.json has no '%s'; using transformers' default %r", key, value)
    not_counted = args.pop("not_counted")
    if mt in WRAPPERS:
        args["vision"], tower_notes = read_vision(cfg, mt, args["hidden"])
        not_counted += tower_notes
    try:
        spec = ModelSpec(
            **args,
            vocab_divisor=_largest_pow2_divisor(args["vocab"]),
            tp=tp,
            name=text_type if mt == text_type else f"{mt}/{text_type}",
            not_counted=tuple(not_counted),
        )
    except ValueError as exc:
        raise HFConfigError(f"{text_type} config.json: {exc}") from None
    for part in not_counted:
        log.warning("packscope FLOPs of %s: not counted: %s", spec.name, part)
    return spec


def read_hf_config(path: str | Path, tp: int = 1) -> ModelSpec:
    """Load ``config.json`` (or a directory holding one) into a :class:`ModelSpec`."""
    return spec_from_hf_dict(load_config_json(path), tp=tp)


def load_config_json(path: str | Path) -> dict[str, Any]:
    """``config.json`` (or a directory holding one) as a dict; any failure is one HFConfigError line."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise HFConfigError(f"no config file at {p}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HFConfigError(f"cannot read {p} as JSON: {exc}") from None
    except RecursionError:  # json's parser recurses once per nesting level
        raise HFConfigError(f"cannot read {p} as JSON: it nests too deeply for a config") from None
    if not isinstance(cfg, dict):
        raise HFConfigError(f"{p} does not hold a JSON object")
    return cfg


def spec_from_hf_config(config: Any, tp: int = 1) -> ModelSpec:
    """A :class:`ModelSpec` from a loaded ``transformers`` config (``model.config``) or a dict.

    A config object is read through ``to_dict()``, wrapper and all, exactly as its config.json would
    be (``packscope flops --hf-config`` reads the same); no import of ``transformers`` is needed.
    """
    return spec_from_hf_dict(config_dict(config), tp=tp)


def config_dict(config: Any) -> Mapping[str, Any]:
    """A loaded ``transformers`` config as its config.json's dict (``to_dict()``), or a dict as it is."""
    if isinstance(config, Mapping):
        return config
    if not hasattr(config, "to_dict"):
        raise HFConfigError(f"expected a transformers config or a dict, got {type(config).__name__}")
    return config.to_dict()


__all__ = [
    "KNOWN",
    "HFConfigError",
    "UnknownModelType",
    "config_dict",
    "load_config_json",
    "model_type",
    "read_hf_config",
    "spec_from_hf_config",
    "spec_from_hf_dict",
]
