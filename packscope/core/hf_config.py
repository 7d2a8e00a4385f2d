"""Read a Hugging Face ``config.json``, or a loaded config object, into a :class:`ModelSpec`
(docs/flops.md, last table).

A config that names an architecture we do not know, or lacks a field we need, is an error that
names it: a silent default would put a wrong number on the dashboard.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packscope.core.flops import ModelSpec

DENSE_GATED = {"llama", "mistral", "qwen2", "qwen3"}
MIXTRAL = {"mixtral"}
QWEN_MOE = {"qwen2_moe", "qwen3_moe"}
GPT2 = {"gpt2"}
KNOWN = sorted(DENSE_GATED | MIXTRAL | QWEN_MOE | GPT2)


class HFConfigError(ValueError):
    """The config cannot be turned into a FLOPs model; the message says why."""


def _need(cfg: dict[str, Any], key: str, arch: str) -> Any:
    if cfg.get(key) is None:
        raise HFConfigError(f"{arch} config.json lacks the field {key!r}, which the FLOPs count needs")
    return cfg[key]


def _largest_pow2_divisor(v: int, cap: int = 128) -> int:
    div = 1
    while div < cap and v % (div * 2) == 0:
        div *= 2
    return div


def model_type(cfg: dict[str, Any]) -> str:
    mt = cfg.get("model_type")
    if mt is None:
        archs = cfg.get("architectures") or []
        raise HFConfigError(
            "config.json has no 'model_type'"
            + (f" (architectures: {', '.join(archs)})" if archs else "")
            + f"; known model types: {', '.join(KNOWN)}"
        )
    if mt not in KNOWN:
        raise HFConfigError(f"unknown model_type {mt!r}; known model types: {', '.join(KNOWN)}")
    return mt


def spec_from_hf_dict(cfg: dict[str, Any], tp: int = 1) -> ModelSpec:
    mt = model_type(cfg)
    if mt in GPT2:
        layers, hidden, heads = (_need(cfg, k, mt) for k in ("n_layer", "n_embd", "n_head"))
        vocab = _need(cfg, "vocab_size", mt)
        return ModelSpec(
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=heads,
            head_dim=hidden // heads,
            ffn=cfg.get("n_inner") or 4 * hidden,
            gated=False,
            vocab=vocab,
            vocab_divisor=_largest_pow2_divisor(vocab),
            tp=tp,
            name=mt,
        )

    layers = _need(cfg, "num_hidden_layers", mt)
    hidden = _need(cfg, "hidden_size", mt)
    heads = _need(cfg, "num_attention_heads", mt)
    vocab = _need(cfg, "vocab_size", mt)
    common = dict(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads,
        gated=True,
        vocab=vocab,
        vocab_divisor=_largest_pow2_divisor(vocab),
        tp=tp,
        name=mt,
    )
    if mt in DENSE_GATED:
        return ModelSpec(ffn=_need(cfg, "intermediate_size", mt), **common)
    if mt in MIXTRAL:
        ffn = _need(cfg, "intermediate_size", mt)
        return ModelSpec(
            ffn=ffn,
            moe_layers=(1,) * layers,
            moe_ffn=ffn,
            moe_topk=_need(cfg, "num_experts_per_tok", mt),
            **common,
        )
    # Qwen2-MoE / Qwen3-MoE: MoE unless listed in mlp_only_layers, every decoder_sparse_step-th.
    step = cfg.get("decoder_sparse_step") or 1
    dense_only = set(cfg.get("mlp_only_layers") or [])
    pattern = tuple(int(i not in dense_only and (i + 1) % step == 0) for i in range(layers))
    ffn = cfg.get("intermediate_size")
    if ffn is None and not all(pattern):
        _need(cfg, "intermediate_size", mt)
    return ModelSpec(
        ffn=ffn or 1,
        moe_layers=pattern,
        moe_ffn=_need(cfg, "moe_intermediate_size", mt),
        moe_topk=_need(cfg, "num_experts_per_tok", mt),
        moe_shared_ffn=cfg.get("shared_expert_intermediate_size") or 0,
        **common,
    )


def read_hf_config(path: str | Path, tp: int = 1) -> ModelSpec:
    """Load ``config.json`` (or a directory holding one) into a :class:`ModelSpec`."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise HFConfigError(f"no config file at {p}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise HFConfigError(f"cannot read {p} as JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise HFConfigError(f"{p} does not hold a JSON object")
    return spec_from_hf_dict(cfg, tp=tp)


def spec_from_hf_config(config: Any, tp: int = 1) -> ModelSpec:
    """A :class:`ModelSpec` from a loaded ``transformers`` config (``model.config``) or a dict.

    Multimodal configs are read through their decoder (``get_text_config()``), whose FLOPs are
    the ones counted here; no import of ``transformers`` is needed.
    """
    if isinstance(config, dict):
        return spec_from_hf_dict(config, tp=tp)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    if not hasattr(config, "to_dict"):
        raise HFConfigError(f"expected a transformers config or a dict, got {type(config).__name__}")
    return spec_from_hf_dict(config.to_dict(), tp=tp)
