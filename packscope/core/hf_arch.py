"""One reader per architecture family: a config dict's fields to ``ModelSpec`` arguments.

Each reader follows the modeling code of transformers 5.24 for its model_type (which layers are
MoE, which attention each layer gets, which width each MLP has), reads every field through
``ConfigFields`` (strict types, transformers' defaults) and returns the keyword arguments of
``ModelSpec`` plus notes of what the count leaves out. docs/flops.md has the table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from packscope.core.attention import CHUNKED, FULL, LINEAR, SLIDING
from packscope.core.flops import MLA, LinearAttention
from packscope.core.hf_fields import ConfigFields

Spec = dict[str, Any]  # ModelSpec keyword arguments, with "not_counted"

_HF_KINDS = {
    "full_attention": FULL,
    "sliding_attention": SLIDING,
    "chunked_attention": CHUNKED,
    "linear_attention": LINEAR,
}


def _dims(f: ConfigFields, head_dim: bool = True) -> Spec:
    """Layers, widths and heads of a q/k/v/o attention model; the head width checked."""
    layers = f.integer("num_hidden_layers")
    hidden = f.integer("hidden_size")
    heads = f.integer("num_attention_heads")
    kv_heads = f.optional_integer("num_key_value_heads")
    kv_heads = heads if kv_heads is None else kv_heads
    if heads % kv_heads:
        raise f.error("num_key_value_heads", f"({kv_heads}) must divide num_attention_heads ({heads})")
    d = f.optional_integer("head_dim") if head_dim else None
    if d is None:
        if hidden % heads:
            raise f.error("head_dim", f"is not given and hidden_size ({hidden}) is not a multiple of heads ({heads})")
        d = hidden // heads
    vocab = f.integer("vocab_size")
    return dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=d, vocab=vocab)


def _layer_types(f: ConfigFields, layers: int, allowed: tuple[str, ...]) -> list[str] | None:
    """An explicit ``layer_types`` list as our kinds, or None when the config leaves it to the default."""
    types = f.string_list("layer_types")
    if types is None:
        return None
    if len(types) != layers:
        raise f.error("layer_types", f"has {len(types)} entries for {layers} layers")
    for i, t in enumerate(types):
        if t not in allowed:
            raise f.error("layer_types", f"entry {i} is {t!r}; this architecture has {', '.join(allowed)}")
    return [_HF_KINDS[t] for t in types]


def _window(f: ConfigFields, kinds: list[str], key: str = "sliding_window") -> int | None:
    """The one window of the sliding layers (an integer >= 1 when there are any)."""
    if SLIDING not in kinds:
        f.raw(key)  # understood, unused
        return None
    return f.integer(key)


def _loose_window(f: ConfigFields) -> int | None:
    """``sliding_window`` where a flag decides whether it is used: any integer >= 0 or null."""
    return f.optional_integer("sliding_window", minimum=0)


def _spec(dims: Spec, kinds: list[str], **extra: Any) -> Spec:
    return {**dims, "layer_kinds": tuple(kinds), "not_counted": [], **extra}


# -- dense and Mixtral-style --------------------------------------------------------------------


def read_llama(f: ConfigFields) -> Spec:
    dims = _dims(f)
    return _spec(dims, [FULL] * dims["layers"], ffn=f.integer("intermediate_size"))


def read_mistral(f: ConfigFields) -> Spec:
    """Mistral and Mixtral: every layer takes ``sliding_window`` when it is set."""
    dims = _dims(f)
    window = f.optional_integer("sliding_window")
    kinds = [SLIDING if window is not None else FULL] * dims["layers"]
    spec = _spec(dims, kinds, ffn=f.integer("intermediate_size"), window=window)
    if f.model_type == "mixtral":
        topk, _ = _experts(f, "num_local_experts")
        spec.update(moe_layers=(1,) * dims["layers"], moe_ffn=spec["ffn"], moe_topk=topk)
    return spec


# Expert counts under the second name transformers' attribute_map gives them.
_EXPERT_ALIASES = {
    "num_local_experts": ("num_experts",),
    "num_experts": ("num_local_experts",),
    "n_routed_experts": ("num_local_experts",),
}


def _experts(f: ConfigFields, count_key: str, topk_key: str = "num_experts_per_tok") -> tuple[int, int]:
    experts = f.integer(count_key, aliases=_EXPERT_ALIASES.get(count_key, ()))
    topk = f.integer(topk_key)
    if topk > experts:
        raise f.error(topk_key, f"({topk}) is more than the {experts} experts ({count_key})")
    return topk, experts


# -- Qwen ---------------------------------------------------------------------------------------


def _qwen_kinds(f: ConfigFields, layers: int, moe_rule: bool = False) -> tuple[list[str], int | None]:
    """Qwen2/Qwen3/Qwen2.5-VL (``moe_rule``: Qwen2-MoE) layer kinds from ``layer_types`` or from
    ``use_sliding_window`` and ``max_window_layers`` as transformers' config derives them."""
    use = f.flag("use_sliding_window")
    raw_window = _loose_window(f)
    first_full = f.optional_integer("max_window_layers", minimum=0)
    window = raw_window if use else None
    kinds = _layer_types(f, layers, ("full_attention", "sliding_attention"))
    if kinds is None and use and first_full is None:
        raise f.error("max_window_layers", "must be an integer when use_sliding_window is true, got None")
    if kinds is None:
        first_full = first_full or 0
        if moe_rule:  # Qwen2-MoE: the even layers below max_window_layers
            kinds = [SLIDING if use and (i + 1) % 2 and i < first_full else FULL for i in range(layers)]
        else:  # the layers from max_window_layers on
            kinds = [SLIDING if window is not None and i >= first_full else FULL for i in range(layers)]
    if SLIDING in kinds:
        if not use:
            raise f.error(
                "layer_types", "has sliding_attention layers but use_sliding_window is false, so there is no window"
            )
        if not window:
            raise f.error("sliding_window", f"must be an integer >= 1 for the sliding layers, got {raw_window!r}")
    return kinds, window if SLIDING in kinds else None


def read_qwen_dense(f: ConfigFields) -> Spec:
    # Qwen2.5-VL's text attention always takes hidden / heads, whatever head_dim says.
    dims = _dims(f, head_dim=f.model_type != "qwen2_5_vl_text")
    kinds, window = _qwen_kinds(f, dims["layers"])
    return _spec(dims, kinds, ffn=f.integer("intermediate_size"), window=window)


def _qwen_moe_layers(f: ConfigFields, layers: int) -> tuple[int, ...]:
    """MoE unless listed in ``mlp_only_layers``, every ``decoder_sparse_step``-th layer, and only with
    ``num_experts`` > 0 (transformers' Qwen2-MoE/Qwen3-MoE/Qwen3-Next decoder layer)."""
    aliases = ("num_local_experts",) if f.model_type == "qwen3_moe" else ()  # its attribute_map
    experts = f.integer("num_experts", minimum=0, aliases=aliases)
    step = f.integer("decoder_sparse_step")
    dense_only = set(f.integer_list("mlp_only_layers") or [])
    return tuple(int(experts > 0 and i not in dense_only and (i + 1) % step == 0) for i in range(layers))


def _qwen_moe_mlp(f: ConfigFields, layers: int, shared_key: str | None) -> Spec:
    pattern = _qwen_moe_layers(f, layers)
    mlp: Spec = dict(ffn=f.integer("intermediate_size"), moe_layers=pattern)
    if any(pattern):
        topk, _ = _experts(f, "num_experts")
        mlp.update(moe_ffn=f.integer("moe_intermediate_size"), moe_topk=topk)
        if shared_key is not None:
            mlp["moe_shared_ffn"] = f.integer(shared_key, minimum=0)
    else:
        f.ignore("num_experts_per_tok", "moe_intermediate_size", *(() if shared_key is None else (shared_key,)))
    return mlp


def read_qwen_moe(f: ConfigFields) -> Spec:
    dims = _dims(f)
    layers = dims["layers"]
    if f.model_type == "qwen2_moe":
        kinds, window = _qwen_kinds(f, layers, moe_rule=True)
        mlp = _qwen_moe_mlp(f, layers, "shared_expert_intermediate_size")
    else:  # qwen3_moe: every layer windows when use_sliding_window, max_window_layers unused
        use = f.flag("use_sliding_window")
        raw_window = _loose_window(f)
        window = raw_window if use else None
        first_full = f.optional_integer("max_window_layers", minimum=0)
        if use and first_full is not None and first_full < layers:
            raise f.error(
                "max_window_layers",
                f"({first_full}) would leave layers full, but transformers' qwen3_moe windows every layer "
                "when use_sliding_window is true; remove it or set it to num_hidden_layers",
            )
        if use and not window:
            raise f.error(
                "sliding_window", f"must be an integer >= 1 when use_sliding_window is true, got {raw_window!r}"
            )
        kinds = [SLIDING if window else FULL] * layers
        mlp = _qwen_moe_mlp(f, layers, None)
    return _spec(dims, kinds, window=window, **mlp)


def read_qwen3_next(f: ConfigFields) -> Spec:
    """Qwen3-Next: gated-delta-net (linear attention) layers and gated full-attention layers."""
    dims = _dims(f)
    layers = dims["layers"]
    kinds = _layer_types(f, layers, ("full_attention", "linear_attention"))
    interval = f.integer("full_attention_interval")
    if kinds is None:
        kinds = [LINEAR if (i + 1) % interval else FULL for i in range(layers)]
    spec = _spec(dims, kinds, attn_output_gate=True, **_qwen_moe_mlp(f, layers, "shared_expert_intermediate_size"))
    linear = LinearAttention(
        num_key_heads=f.integer("linear_num_key_heads"),
        num_value_heads=f.integer("linear_num_value_heads"),
        key_head_dim=f.integer("linear_key_head_dim"),
        value_head_dim=f.integer("linear_value_head_dim"),
        conv_kernel=f.integer("linear_conv_kernel_dim"),
    )
    if LINEAR in kinds:
        spec["linear_attention"] = linear
    mtp = f.optional_integer("mtp_num_hidden_layers", minimum=0)
    if mtp:
        spec["not_counted"].append(f"the MTP module (mtp_num_hidden_layers={mtp}), which transformers does not build")
    return spec


# -- Gemma, GPT-OSS -----------------------------------------------------------------------------


def read_gemma(f: ConfigFields) -> Spec:
    """Gemma 2 (sliding every other layer) and Gemma 3 (five in six, ``sliding_window_pattern``)."""
    dims = _dims(f)
    layers = dims["layers"]
    if dims["hidden"] % dims["heads"]:
        raise f.error("num_attention_heads", f"({dims['heads']}) must divide hidden_size ({dims['hidden']})")
    if f.flag("use_bidirectional_attention"):
        raise f.error("use_bidirectional_attention", "is true: bidirectional attention is not counted")
    kinds = _layer_types(f, layers, ("full_attention", "sliding_attention"))
    if f.model_type == "gemma2":
        if kinds is None:
            kinds = [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]
        legacy = f.optional_integer("sliding_window_size")
        if legacy is not None and legacy != f.cfg.get("sliding_window", f.defaults["sliding_window"]):
            raise f.error("sliding_window_size", f"({legacy}) differs from sliding_window; give one window")
    else:
        pattern = f.integer("sliding_window_pattern")
        if kinds is None:
            kinds = [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
    return _spec(dims, kinds, ffn=f.integer("intermediate_size"), window=_window(f, kinds))


def read_gpt_oss(f: ConfigFields) -> Spec:
    """GPT-OSS: alternating sliding / full layers, every layer MoE. The attention sinks (one logit
    per head in the softmax) are no GEMM and cost nothing here."""
    dims = _dims(f)
    layers = dims["layers"]
    kinds = _layer_types(f, layers, ("full_attention", "sliding_attention"))
    if kinds is None:
        kinds = [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]
    topk, _ = _experts(f, "num_local_experts")
    repeated = f.optional_integer("experts_per_token")
    if repeated is not None and repeated != topk:
        raise f.error("experts_per_token", f"({repeated}) differs from num_experts_per_tok ({topk})")
    width = f.integer("intermediate_size")
    return _spec(
        dims, kinds, ffn=width, window=_window(f, kinds), moe_layers=(1,) * layers, moe_ffn=width, moe_topk=topk
    )


# -- Llama 4 ------------------------------------------------------------------------------------


def read_llama4(f: ConfigFields) -> Spec:
    """Llama 4: chunked attention on the RoPE layers, full on the NoPE ones (``no_rope_layers``
    0); MoE layers from ``moe_layers`` or ``interleave_moe_layer_step``, each with a shared expert;
    dense layers ``intermediate_size_mlp`` wide."""
    dims = _dims(f)
    layers = dims["layers"]
    no_rope = f.integer_list("no_rope_layers")
    interval = f.integer("no_rope_layer_interval")
    if not no_rope:  # transformers: an empty list means the default, one NoPE layer per interval
        no_rope = [int((i + 1) % interval != 0) for i in range(layers)]
    elif len(no_rope) != layers or any(x not in (0, 1) for x in no_rope):
        raise f.error("no_rope_layers", f"must hold one 0/1 flag per layer ({layers}), got {no_rope!r}")
    chunk = f.optional_integer("attention_chunk_size")
    kinds = _layer_types(f, layers, ("full_attention", "chunked_attention"))
    if kinds is None:
        kinds = [CHUNKED if uses_rope and chunk is not None else FULL for uses_rope in no_rope]
    if CHUNKED in kinds and chunk is None:
        raise f.error("layer_types", "has chunked_attention layers but attention_chunk_size is null")
    listed = f.integer_list("moe_layers")
    step = f.integer("interleave_moe_layer_step")
    if listed is None:
        listed = list(range(step - 1, layers, step))
    elif any(i >= layers for i in listed):
        raise f.error("moe_layers", f"lists a layer beyond the {layers} layers: {listed!r}")
    moe = tuple(int(i in set(listed)) for i in range(layers))
    topk, _ = _experts(f, "num_local_experts")
    expert = f.integer("intermediate_size")
    return _spec(
        dims,
        kinds,
        chunk=chunk if CHUNKED in kinds else None,
        ffn=f.integer("intermediate_size_mlp"),
        moe_layers=moe,
        moe_ffn=expert,
        moe_topk=topk,
        moe_shared_ffn=expert if any(moe) else 0,
    )


# -- DeepSeek-V3 / Kimi-K2 (MLA) ----------------------------------------------------------------


def read_deepseek(f: ConfigFields) -> Spec:
    """DeepSeek-V3 and Kimi-K2: MLA in every layer, dense MLPs for the first ``first_k_dense_replace``
    layers and MoE (routed + shared experts) after, ``num_nextn_predict_layers`` MTP modules."""
    layers = f.integer("num_hidden_layers")
    hidden = f.integer("hidden_size")
    heads = f.integer("num_attention_heads")
    kv_heads = f.optional_integer("num_key_value_heads")
    if kv_heads is not None and kv_heads != heads:
        raise f.error("num_key_value_heads", f"({kv_heads}) must equal num_attention_heads ({heads}) for MLA")
    mla = MLA(
        q_lora_rank=f.optional_integer("q_lora_rank"),
        kv_lora_rank=f.integer("kv_lora_rank"),
        qk_nope_head_dim=f.integer("qk_nope_head_dim", minimum=0),
        qk_rope_head_dim=f.integer("qk_rope_head_dim", minimum=0),
        v_head_dim=f.integer("v_head_dim"),
    )
    if f.integer("moe_layer_freq") != 1:
        raise f.error(
            "moe_layer_freq",
            "is not 1: transformers' DeepseekV3 ignores it (MoE from first_k_dense_replace on) while "
            "DeepSeek's own code skips layers; the two models differ, so neither is counted",
        )
    first_dense = f.integer("first_k_dense_replace", minimum=0)
    topk, _ = _experts(f, "n_routed_experts")
    mtp = f.integer("num_mtp_layers", minimum=0, aliases=("num_nextn_predict_layers",))
    f.ignore("head_dim")  # transformers sets it to qk_rope_head_dim (the rotary width); MLA's widths are above
    expert = f.integer("moe_intermediate_size")
    return {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "vocab": f.integer("vocab_size"),
        "mla": mla,
        "ffn": f.integer("intermediate_size"),
        "moe_layers": tuple(int(i >= first_dense) for i in range(layers)),
        "moe_ffn": expert,
        "moe_topk": topk,
        "moe_shared_ffn": expert * f.integer("n_shared_experts", minimum=0),
        "mtp_depth": mtp,
        "not_counted": [],
    }


# -- GPT-2 --------------------------------------------------------------------------------------


def read_gpt2(f: ConfigFields) -> Spec:
    # GPT2Config's attribute_map lets a config.json use the common names too.
    layers = f.integer("n_layer", aliases=("num_hidden_layers",))
    hidden = f.integer("n_embd", aliases=("hidden_size",))
    heads = f.integer("n_head", aliases=("num_attention_heads",))
    if hidden % heads:
        raise f.error("n_head", f"({heads}) must divide n_embd ({hidden})")
    inner = f.optional_integer("n_inner")
    dims = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=heads, head_dim=hidden // heads)
    return _spec({**dims, "vocab": f.integer("vocab_size")}, [FULL] * layers, ffn=inner or 4 * hidden, gated=False)


READERS: dict[str, Callable[[ConfigFields], Spec]] = {
    "llama": read_llama,
    "mistral": read_mistral,
    "mixtral": read_mistral,
    "qwen2": read_qwen_dense,
    "qwen3": read_qwen_dense,
    "qwen2_5_vl_text": read_qwen_dense,
    "qwen2_moe": read_qwen_moe,
    "qwen3_moe": read_qwen_moe,
    "qwen3_next": read_qwen3_next,
    "gemma2": read_gemma,
    "gemma3_text": read_gemma,
    "gpt_oss": read_gpt_oss,
    "llama4_text": read_llama4,
    "deepseek_v3": read_deepseek,
    "kimi_k2": read_deepseek,
    "gpt2": read_gpt2,
}
