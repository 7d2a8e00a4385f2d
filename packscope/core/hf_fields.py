"""Typed, strict access to the fields of one Hugging Face config dict.

A field that is absent takes the default the installed transformers' config class gives it
(``hf_defaults``), so the count is that of the model transformers builds from the file; a field
that is present must have the right JSON type (no bools for integers, no floats for layer
counts, no strings) and a sensible value. Every field read is remembered, so that a field which
would change the count but which no reader understood is refused by name at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packscope.core.model_fields import MAX_MODEL_SIZE


class HFConfigError(ValueError):
    """The config cannot be turned into a FLOPs model; the message says why, on one line."""


class UnknownModelType(HFConfigError):
    """No hand-written reader for the config's model_type: the structural count
    (``packscope.agent.hf_structure``, with transformers) may still read it."""


_ABSENT = object()

# Fields that change GEMM shapes or the attention pattern of some architecture. One that is set
# (not null, false, 0 or empty) in a config, but that the reader of its model_type did not read,
# is an error: it means something we do not count.
COUNT_FIELDS = frozenset(
    {
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "n_inner",
        "sliding_window",
        "sliding_window_size",
        "sliding_window_pattern",
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
        "attention_chunk_size",
        "no_rope_layers",
        "no_rope_layer_interval",
        "use_bidirectional_attention",
        "is_causal",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "num_experts",
        "num_local_experts",
        "n_routed_experts",
        "num_experts_per_tok",
        "experts_per_token",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "n_shared_experts",
        "first_k_dense_replace",
        "moe_layer_freq",
        "decoder_sparse_step",
        "mlp_only_layers",
        "interleave_moe_layer_step",
        "moe_layers",
        "intermediate_size_mlp",
        "num_nextn_predict_layers",
        "num_mtp_layers",
        "mtp_num_hidden_layers",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
        "full_attention_interval",
        "hybrid_override_pattern",
        "layers_block_type",
        # DeepSeek-V3.2's sparse attention (its indexer and top-k), were they relabelled deepseek_v3
        "index_topk",
        "index_n_heads",
        "index_head_dim",
        "mlp_layer_types",
        # Gemma 4's text fields, were they relabelled gemma3_text
        "per_layer_config",
        "hidden_size_per_layer_input",
        "vocab_size_per_layer_input",
        "num_kv_shared_layers",
        "enable_moe_block",
        "top_k_experts",
        "attention_k_eq_v",
        "use_double_wide_mlp",
    }
)
# Values that mean "this feature is off" and so change nothing when nobody reads them.
_OFF_VALUES: dict[str, tuple[Any, ...]] = {"is_causal": (True, None)}
_DEFAULT_OFF: tuple[Any, ...] = (None, False, 0, [], {}, "")


def _is_off(key: str, value: Any) -> bool:
    off = _OFF_VALUES.get(key, _DEFAULT_OFF)
    return any(value is v or (type(value) is type(v) and value == v) for v in off)


# Core sizes: one absent from a config takes transformers' default, and the user is told so.
CORE_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")


class ConfigFields:
    """One config dict (or a wrapper's ``text_config``) read by one architecture's reader."""

    def __init__(self, cfg: Mapping[str, Any], model_type: str, defaults: Mapping[str, Any], where: str = "") -> None:
        self.cfg = cfg
        self.model_type = model_type
        self.defaults = defaults
        self.where = where  # "text_config." for a wrapper's decoder
        self.read: set[str] = set()
        self.defaulted: dict[str, Any] = {}  # core sizes taken from transformers' defaults

    # -- errors ----------------------------------------------------------------------------------
    def error(self, key: str, problem: str) -> HFConfigError:
        return HFConfigError(f"{self.model_type} config.json: '{self.where}{key}' {problem}")

    # -- raw access ------------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        """True when the config itself gives the field (null counts as given)."""
        return key in self.cfg

    def raw(self, key: str, aliases: tuple[str, ...] = ()) -> Any:
        """The config's value, or transformers' default when absent."""
        return self._named(key, aliases)[1]

    def _named(self, key: str, aliases: tuple[str, ...] = ()) -> tuple[str, Any]:
        """(the name the config uses, its value). ``aliases``: other names transformers maps onto
        the same field (its ``attribute_map``); given under two names, the values must agree."""
        names = (key, *aliases)
        self.read.update(names)
        given = {k: self.cfg[k] for k in names if k in self.cfg}
        if len({repr(v) for v in given.values()}) > 1:
            raise self.error(key, f"is given under several names with different values: {given}")
        if given:
            return next(iter(given.items()))
        value = self.defaults.get(key, _ABSENT)
        if value is _ABSENT:
            raise self.error(key, "is missing, and transformers gives it no default")
        if key in CORE_SIZES:
            self.defaulted[f"{self.where}{key}"] = value
        return key, value

    def ignore(self, *keys: str) -> None:
        """Mark fields as understood without a value mattering (e.g. routing knobs)."""
        self.read.update(keys)

    # -- typed access ----------------------------------------------------------------------------
    def integer(self, key: str, minimum: int = 1, aliases: tuple[str, ...] = ()) -> int:
        return self._integer(*self._named(key, aliases), minimum)

    def optional_integer(self, key: str, minimum: int = 1, aliases: tuple[str, ...] = ()) -> int | None:
        name, value = self._named(key, aliases)
        return None if value is None else self._integer(name, value, minimum)

    def _integer(self, key: str, value: Any, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer, got {value!r}")
        if not minimum <= value <= MAX_MODEL_SIZE:
            raise self.error(key, f"must be an integer from {minimum} to {MAX_MODEL_SIZE}, got {value!r}")
        return value

    def flag(self, key: str) -> bool:
        value = self.raw(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def integer_list(self, key: str, minimum: int = 0) -> list[int] | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.error(key, f"must be a list of integers, got {value!r}")
        return [self._integer(f"{key}[{i}]", x, minimum) for i, x in enumerate(value)]

    def string_list(self, key: str) -> list[str] | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise self.error(key, f"must be a list of strings, got {value!r}")
        return list(value)

    # -- the final check -------------------------------------------------------------------------
    def refuse_unread(self, count_fields: frozenset[str] = COUNT_FIELDS) -> None:
        """Refuse any of ``count_fields`` (fields that would change the count) that this reader did not read."""
        for key in sorted(count_fields - self.read):
            if key in self.cfg and not _is_off(key, self.cfg[key]):
                raise self.error(
                    key,
                    f"is set ({self.cfg[key]!r}) but packscope does not read it for model_type "
                    f"{self.model_type!r}, and it would change the FLOPs; remove it if the model does not "
                    "use it, or ask for the architecture to be supported",
                )
