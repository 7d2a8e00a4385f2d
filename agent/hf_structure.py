"""The FLOPs model of any decoder transformers can build, read off the model's own structure
(docs/flops.md, "The structural count").

For a config whose model_type has no hand-written reader (``packscope.core.hf_arch``), the model is
built by transformers on the meta device (no weights, no download) and walked layer by layer:
every ``nn.Linear`` and causal ``nn.Conv1d`` of the attention, of the linear mixers (gated delta
nets, short convolutions), of the MLP (fused experts times the config's top-k, shared experts, the
router left out) and of the head gives C_lin; each layer's attention kind comes from the config
(``layer_types``, the window, DeepSeek-V3.2's top-k) and the attention widths from the modules.
The result is a :class:`ModelSpec` with ``measured`` set, so the CLI, the Python API, the HF
callback and the server use it as any other model.

Nothing is dropped silently: a config key transformers' config class does not define (and that is
not on the short list of keys known to change no GEMM) is an error naming it, as is a part of a
layer that holds GEMMs we do not place, and a layer kind we cannot price.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import inspect
import logging
import re
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packscope.agent import hf_gemma
from packscope.agent.hf_audio import audio_from_structure
from packscope.agent.hf_towers import towers, vision_from_structure
from packscope.core.attention import CHUNKED, FULL, LINEAR, SLIDING
from packscope.core.flops import COMPONENTS, Measured, ModelSpec
from packscope.core.hf_fields import CORE_SIZES, HFConfigError

log = logging.getLogger(__name__)

# Keys published checkpoints carry that no config class defines and that change no GEMM.
HARMLESS_KEYS = frozenset(
    {
        "architectures",
        "auto_map",
        "model_type",
        "torch_dtype",
        "dtype",
        "transformers_version",
        "_name_or_path",
        "name_or_path",
        "quantization_config",
        "use_cache",
        "initializer_range",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "attention_dropout",
        "hidden_dropout",
        "rope_scaling",
        "rope_theta",
        "rope_parameters",
        "max_position_embeddings",
        "max_window_layers",  # read where it matters: a window's layers come from layer_types here
        "_attn_implementation_autoset",
        # training and inference knobs published configs carry: no GEMM shape, no attention pattern
        "aux_loss_alpha",
        "router_aux_loss_coef",
        "output_router_logits",
        "seq_aux",
        "scoring_func",
        "topk_method",
        "norm_topk_prob",
        "routed_scaling_factor",
        "ep_size",
        "pretraining_tp",
        "cache_implementation",
        "use_mrope",
        "image_token_id",
        "video_token_id",
        "vision_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
        "for_llm_compressor",
        "tie_word_embeddings",
        "rms_norm_eps",
        "layer_norm_eps",
        "hidden_act",
        "attention_bias",
        "mlp_bias",
        "mamba_ssm_dtype",  # the dtype of a recurrent state (Qwen3.5's gated delta nets)
        # Gemma 3n's published text_config, keys transformers 5.25's class dropped: the local layers'
        # RoPE base, the attention's query scaling (hardwired to 1) and an optimizer knob
        "rope_local_base_freq",
        "query_pre_attn_scalar",
        "altup_lr_multiplier",
    }
)
# Keys published checkpoints carry that the config class does not define, accepted with the value
# the modeling code hardwires (another value is refused by name: the model would not be the one built).
HARDWIRED: dict[tuple[str, str], Any] = {
    ("qwen3_5_text", "attn_output_gate"): True,  # q_proj is always 2 · heads · head_dim wide
    ("qwen3_5_moe_text", "attn_output_gate"): True,
    ("qwen3_5_text", "mlp_only_layers"): [],  # every layer's MLP is the config's kind (dense / MoE)
    ("qwen3_5_moe_text", "mlp_only_layers"): [],
    ("qwen3_5_vision", "deepstack_visual_indexes"): [],  # Qwen3.5's tower has no deepstack mergers
    ("qwen3_5_moe_vision", "deepstack_visual_indexes"): [],
    # LongCat-Flash's checkpoints name what transformers always builds: MLA with its LoRA scaling on
    # both latents, and zero-computation experts that pass the token through (identity)
    ("longcat_flash", "attention_method"): "MLA",
    ("longcat_flash", "mla_scale_q_lora"): True,
    ("longcat_flash", "mla_scale_kv_lora"): True,
    ("longcat_flash", "zero_expert_type"): "identity",
}
_NOT_HARDWIRED = object()
# Keys of a module the checkpoint holds but transformers does not build (its forward never runs it):
# accepted, left out of the count, and named in ModelSpec.not_counted when set, as the hand-written
# Qwen3-Next reader does for the same key.
NOT_BUILT = {
    (text_type, key): "the MTP module (mtp_num_hidden_layers={}), which transformers does not build"
    if key == "mtp_num_hidden_layers"
    else ""
    for text_type in ("qwen3_5_text", "qwen3_5_moe_text")
    for key in ("mtp_num_hidden_layers", "mtp_use_dedicated_embeddings")
}
# Experts per token, under the names configs give it.
TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "top_k_experts", "num_experts_per_token", "moe_k")
# Children of a decoder layer, by what they do.
ATTENTION_PARTS = ("self_attn", "attention", "attn")
MIXER_PARTS = ("linear_attn", "conv", "short_conv", "mamba", "mixer")
MLP_PARTS = ("mlp", "feed_forward", "block_sparse_moe", "moe")
SHARED_PARTS = ("shared_mlp", "shared_experts", "shared_expert")
ROUTERS = ("gate", "router", "shared_expert_gate", "e_score_correction_bias")
_HF_KINDS = {
    "full_attention": FULL,
    "attention": FULL,  # Granite-4.0-H's name for its attention layers
    "sliding_attention": SLIDING,
    "chunked_attention": CHUNKED,
}
# The sub-configs of the towers a wrapper may hold: absent, transformers would build its default
# one, not the checkpoint's (a wrapper's class that has no such sub-config needs none).
_TOWER_CONFIGS = ("vision_config", "audio_config")
# Omni wrappers whose training forward is the thinker's alone (config key, thinker model_type): the
# top-level class has no forward, its talker and code2wav run in generate() only, so a fine-tune
# runs the thinker (decoder, vision and audio towers) and they do no work in training.
THINKERS = {"qwen3_omni_moe": ("thinker_config", "qwen3_omni_moe_thinker")}
# Wrappers whose tower transformers builds through timm (TimmWrapperModel), which must be installed.
TIMM_TOWERS = {"gemma3n": "its vision tower, timm's mobilenetv5_300m_enc"}


def _transformers(model_type: str) -> Any:
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError:
        raise HFConfigError(
            f"model_type {model_type!r} has no hand-written FLOPs reader; install transformers and torch "
            "(pip install transformers torch) so packscope can count it from the model's own structure"
        ) from None
    return transformers


def config_class(model_type: str) -> type[Any]:
    _transformers(model_type)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        import transformers

        raise HFConfigError(
            f"unknown model_type {model_type!r}: transformers {transformers.__version__} has no config class for it"
        )
    return CONFIG_MAPPING[model_type]


def _defined_keys(cls: type[Any]) -> set[str]:
    """The keys a config class defines: its fields, its defaults' keys, its attribute_map's names."""
    keys = set(getattr(cls, "attribute_map", {}) or {})
    if dataclasses.is_dataclass(cls):
        keys |= {f.name for f in dataclasses.fields(cls)}
    post_init = getattr(cls, "__post_init__", None)
    if post_init is not None:  # keys consumed as kwargs there (Gemma 3's sliding_window_pattern)
        with contextlib.suppress(OSError, TypeError):
            keys |= set(re.findall(r"kwargs\.(?:get|pop)\(\s*[\"'](\w+)[\"']", inspect.getsource(post_init)))
    # A config class that cannot build its defaults still has its fields above.
    with contextlib.suppress(TypeError, ValueError):
        keys |= set(cls().to_dict())
    return keys


def check_keys(cfg: Mapping[str, Any], model_type: str, where: str = "", read: frozenset[str] = frozenset()) -> None:
    """Refuse, by name, a key transformers' config class for ``model_type`` does not define (the
    modeling code would ignore it, and it could change the count), except the keys known to change
    no GEMM and those the modeling code read while building the model (``read``: it kept them; a
    wrapper's sub-configs are checked the same way)."""
    cls = config_class(model_type)
    defined = _defined_keys(cls)
    for key in cfg:
        hardwired = HARDWIRED.get((model_type, key), _NOT_HARDWIRED)
        if cfg[key] == hardwired or (model_type, key) in NOT_BUILT:
            continue
        if key not in defined and key not in HARMLESS_KEYS and key not in read:
            if hardwired is not _NOT_HARDWIRED:
                raise HFConfigError(
                    f"{model_type} config.json: '{where}{key}' is {cfg[key]!r}, but transformers' modeling code "
                    f"builds the model as if it were {hardwired!r} (its config class has no such field)"
                )
            raise HFConfigError(
                f"{model_type} config.json: '{where}{key}' is not a field of transformers' {cls.__name__}: "
                "transformers would drop it, and it may change the FLOPs; remove it, or use the model_type "
                "that defines it"
            )
    for name, sub in (getattr(cls, "sub_configs", None) or {}).items():
        value = cfg.get(name)
        if isinstance(value, Mapping) and value:
            # the class transformers builds for it (an old checkpoint's model_type may name the wrapper)
            sub_type = getattr(sub, "model_type", "") or value.get("model_type")
            if isinstance(sub_type, str) and sub_type:
                check_keys(value, sub_type, f"{where}{name}.", read)


# Core sizes a config class reads under another name that no attribute_map gives (a property).
SIZE_ALIASES = {("longcat_flash", "num_hidden_layers"): "num_layers"}  # 2 · num_layers attentions


def _notice_missing_sizes(cfg: Mapping[str, Any], text: Any, where: str) -> None:
    aliases = getattr(type(text), "attribute_map", None) or {}  # the name transformers reads: the real field
    for key in CORE_SIZES:
        given = (aliases.get(key), SIZE_ALIASES.get((text.model_type, key)))
        if key not in cfg and not any(alias in cfg for alias in given if alias) and hasattr(text, key):
            log.warning(
                "packscope FLOPs: config.json has no '%s%s'; using transformers' default %r",
                where,
                key,
                getattr(text, key),
            )


# -- module shapes --------------------------------------------------------------------------------


TRAINED, FORWARD_ONLY = 6, 2  # FLOPs per multiply-add: forward and backward, or forward alone


_NO_GRAD: dict[Any, bool] = {}  # module class -> whether its forward runs without grad


def _runs_without_grad(cls: Any) -> bool:
    """True when a module class's forward runs under ``torch.no_grad`` (DeepSeek-V3.2's indexer in
    transformers): its GEMMs have no backward, 2 FLOPs per multiply-add."""
    if cls not in _NO_GRAD:
        try:
            source = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            source = ""
        head = source[: source.index("def forward")] if "def forward" in source else ""
        _NO_GRAD[cls] = "no_grad" in head
    return _NO_GRAD[cls]


def _gemm_flops(module: Any, per_mac: int = TRAINED) -> int:
    """FLOPs per token of every nn.Linear under ``module`` and of every causal (depthwise) nn.Conv1d
    (one output per channel and token: its weight's size), 6 per multiply-add, 2 under a module
    whose forward runs without grad."""
    from torch import nn

    if _runs_without_grad(type(module)):
        per_mac = FORWARD_ONLY
    if isinstance(module, nn.Linear):
        own = module.in_features * module.out_features
    elif isinstance(module, nn.Conv1d):
        own = module.weight.numel()
    else:
        own = 0
    return own * per_mac + sum(_gemm_flops(child, per_mac) for child in module.children())


def _expert_flops(experts: Any) -> int:
    """FLOPs per token of one routed expert: fused 3-D weights (one slice each), or the first expert
    of a module list."""
    weights = [p for p in experts.parameters(recurse=False) if p.dim() == 3]
    if weights:
        return TRAINED * sum(p[0].numel() for p in weights)
    children = list(experts.children())
    if children:
        return _gemm_flops(children[0])
    raise HFConfigError(f"{type(experts).__name__}: no expert weights to count")


def _topk(text: Any) -> int:
    for key in TOPK_KEYS:
        value = getattr(text, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise HFConfigError(
        f"{text.model_type} config: an MoE layer, but no experts-per-token field ({', '.join(TOPK_KEYS)})"
    )


# Per-layer keys of _layer_parts beside COMPONENTS: an MoE block with zero-computation experts
# (LongCat-Flash) prices its routed experts per assignment to a real one (Measured.c_assignment).
ASSIGNMENT, SLOTS = "assignment", "slots"


def _mlp_parts(mlp: Any, text: Any) -> dict[str, int]:
    experts = getattr(mlp, "experts", None)
    if experts is None:
        return {"dense_mlp": _gemm_flops(mlp)}
    if getattr(mlp, "zero_expert_num", 0):
        # a slot routed to a zero-computation expert (an identity) runs no GEMM: which slots do is
        # the routing's, so the work is priced per assignment to a real expert, not per token
        parts = {ASSIGNMENT: _expert_flops(experts), SLOTS: _topk(text), "moe_shared": 0}
    else:
        parts = {"moe_routed": _topk(text) * _expert_flops(experts), "moe_shared": 0}
    for name, child in mlp.named_children():
        if name == "experts" or name in ROUTERS:
            continue
        if name.startswith("shared"):
            parts["moe_shared"] += _gemm_flops(child)
        elif _gemm_flops(child):
            raise HFConfigError(
                f"{text.model_type}: the MoE block's part {name!r} holds GEMMs packscope does not place"
            )
    return parts


def _state_flops(mixer: Any) -> int:
    """Per-token FLOPs of a linear mixer that no module shape holds: the delta-rule state update of
    a gated delta net, 4 · value heads · d_v² multiply-adds (Megatron-LM's convention, as the
    hand-written Qwen3-Next count); a short convolution has none beyond its conv."""
    name = type(mixer).__name__
    if "GatedDeltaNet" in name:
        return TRAINED * 4 * mixer.num_v_heads * mixer.head_v_dim**2
    if "DeltaAttention" in name:  # Kimi's KDA: the delta rule with a per-channel decay (elementwise)
        return TRAINED * 4 * mixer.num_heads * mixer.head_dim**2
    if hasattr(mixer, "ssm_state_size") and hasattr(mixer, "intermediate_size"):
        # Mamba-2's selective scan: Megatron-LM's hybrid formula, 7 · d_inner · d_state forward
        # FLOPs per token (mamba_layer_flops), times 3 for forward and backward (hybrid_flops)
        return 3 * 7 * mixer.intermediate_size * mixer.ssm_state_size
    if "ShortConv" in name:
        return 0
    raise HFConfigError(f"layer kind {name} (a recurrent / state-space mixer) cannot be priced by packscope yet")


def _core_flops(attn: Any, text: Any) -> int:
    """FLOPs per unit of s² of one attention module: 3 · n · (d_qk + d_v) (QKᵀ and P·V over
    about s²/2 pairs, forward and backward), widths from its shapes."""
    v = getattr(attn, "v_head_dim", None) or attn.head_dim
    qk = getattr(attn, "qk_head_dim", None) or attn.head_dim
    out = getattr(attn, "o_proj", None) or getattr(attn, "out_proj", None) or getattr(attn, "dense", None)
    if out is None or out.in_features % v:
        raise HFConfigError(
            f"{text.model_type}: the attention {type(attn).__name__} has no output projection to size it"
        )
    heads = out.in_features // v
    return 3 * heads * (qk + v)


def _indexer_flops(indexer: Any) -> int:
    """FLOPs per unit of s² of DeepSeek-V3.2's lightning indexer, which scores every causal (query,
    key) pair: n_index · d_index multiply-adds for q·k and n_index for the head weights, per pair;
    forward only where transformers runs it without grad."""
    macs = indexer.n_heads * (indexer.head_dim + 1)
    per_mac = FORWARD_ONLY if _runs_without_grad(type(indexer)) else TRAINED
    return per_mac * macs // 2


def _layer_kind(text: Any, i: int, has_attention: bool) -> str:
    types = getattr(text, "layer_types", None)
    if not has_attention:
        return LINEAR
    if types is None:
        for key in ("sliding_window", "attention_chunk_size"):
            if getattr(text, key, None):
                raise HFConfigError(
                    f"{text.model_type} config: {key!r} is set without layer_types; which layers use it is not "
                    "known to the structural count"
                )
        return FULL
    t = types[i]
    if t in _HF_KINDS:
        return _HF_KINDS[t]
    if t == "indexed_attention":
        return SLIDING  # top-k of the causal keys: the pairs of a window of index_topk
    if t in ("hybrid",):  # attention and a mixer side by side in one layer
        return FULL
    raise HFConfigError(f"{text.model_type} config: layer kind {t!r} (layer_types[{i}]) cannot be priced")


def _decoder(model: Any) -> Any:
    decoder = model.get_decoder()
    while not hasattr(decoder, "layers"):
        decoder = decoder.model
    return decoder


def _decoder_layers(model: Any) -> list[Any]:
    return list(_decoder(model).layers)


def _mtp_depth(text: Any) -> int:
    for key in ("num_nextn_predict_layers", "num_mtp_layers", "mtp_num_hidden_layers"):
        if (text.model_type, key) in NOT_BUILT:
            continue
        value = getattr(text, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _is_linear_mixer(module: Any) -> bool:
    name = type(module).__name__
    return "DeltaAttention" in name or "GatedDeltaNet" in name


def _layer_parts(layer: Any, text: Any) -> tuple[dict[str, int], Any, Any]:
    """(per-token multiply-adds by component, the attention module or None, the mixer or None)."""
    from torch import nn

    parts: dict[str, int] = defaultdict(int)
    children = dict(layer.named_children())
    # parts only Gemma 3n / Gemma 4 have (AltUp, Laurel, per-layer inputs, Gemma 4's MoE block)
    extra, claimed = hf_gemma.layer_parts(layer, text, _topk)
    attn = next((children[n] for n in ATTENTION_PARTS if n in children), None)
    mixer = next((children[n] for n in MIXER_PARTS if n in children), None)
    mlp = next((children[n] for n in MLP_PARTS if n in children and id(children[n]) not in claimed), None)
    if attn is not None and mixer is None and _is_linear_mixer(attn):  # Kimi-Linear's KDA sits in self_attn
        attn, mixer = None, attn
    if attn is not None:
        parts["attention"] += _gemm_flops(attn)  # a list of them (LongCat-Flash's two) as one
    if mixer is not None:
        parts["linear_attention"] += _gemm_flops(mixer)
        parts["linear_attention_state"] += _state_flops(mixer)
    mlp_parts = _mlp_parts(mlp, text) if mlp is not None else {}
    for key, value in (*mlp_parts.items(), *extra.items()):
        parts[key] += value
    dense = children.get("mlps")  # LongCat-Flash: a dense MLP after each of its two attentions
    if isinstance(dense, nn.ModuleList):
        parts["dense_mlp"] += _gemm_flops(dense)
    placed = {id(m) for m in (attn, mixer, mlp, dense) if m is not None} | claimed
    for name, child in children.items():
        if id(child) in placed or not (_gemm_flops(child) or _has_expert_weights(child)):
            continue
        if name in SHARED_PARTS and ("moe_routed" in mlp_parts or ASSIGNMENT in mlp_parts):
            parts["moe_shared"] += _gemm_flops(child)
        else:
            raise HFConfigError(
                f"{text.model_type}: layer part {name!r} ({type(child).__name__}) holds GEMMs packscope does not "
                "place; this layer kind cannot be priced yet"
            )
    return parts, attn, mixer


def _has_expert_weights(module: Any) -> bool:
    """Fused expert weights (3-D parameters) anywhere under ``module``: GEMMs no nn.Linear shows."""
    return any(p.dim() == 3 for p in module.parameters())


def _refuse_gemms_outside(model: Any, layers: list[Any], head: Any, text: Any, towers: tuple[Any, ...] = ()) -> None:
    """A GEMM outside the decoder layers, the head and the counted towers (Gemma 4's per-layer input
    projection, a projector) is work the walk would drop: refuse it by name."""
    from torch import nn

    placed = {id(m) for part in (*layers, *towers) for m in part.modules()} | {id(head)}
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv1d)) and id(module) not in placed:
            raise HFConfigError(
                f"{text.model_type}: module {name!r} ({type(module).__name__}) runs outside the decoder layers "
                "and the head, and packscope does not place it; this model cannot be priced yet"
            )


def measure(model: Any, text: Any, towers: tuple[Any, ...] = ()) -> tuple[Measured, list[str], int | None, int | None]:
    """The work of a model built by transformers: (measured, layer kinds, window, chunk); the
    ``towers`` are counted apart (``packscope.agent.hf_towers``)."""
    gemm: dict[str, int] = defaultdict(int)
    core: dict[str, int] = defaultdict(int)
    kinds: list[str] = []
    assignment: set[int] = set()  # one real expert's work, the same in every such layer
    layers = _decoder_layers(model)
    with_tower = {id(t) for t in towers}  # mllama's cross-attention layers: priced with its tower
    for i, layer in enumerate(layers):
        if id(layer) in with_tower:
            continue
        parts, attn, _ = _layer_parts(layer, text)
        if ASSIGNMENT in parts:
            assignment.add(parts.pop(ASSIGNMENT))
        for key, value in parts.items():
            gemm[key] += value
        kind = _layer_kind(text, i, attn is not None)
        kinds.append(kind)
        for one in _attentions(attn):
            core[kind] += _core_flops(one, text)
            if getattr(one, "indexer", None) is not None:
                core[FULL] += _indexer_flops(one.indexer)
    head = model.get_output_embeddings()
    gemm["logits"] += TRAINED * head.in_features * head.out_features
    beside, beside_modules = hf_gemma.model_parts(_decoder(model), text)  # GEMMs once per token beside the layers
    embedders, embedder_modules = hf_gemma.wrapper_parts(model, text)  # Gemma 3n's, on every text token
    for key, value in (*beside.items(), *embedders.items()):
        gemm[key] += value
    _refuse_gemms_outside(model, layers, head, text, (*towers, *beside_modules, *embedder_modules))
    mtp = _mtp_depth(text)
    if mtp:
        _add_mtp(model, text, mtp, gemm, core, kinds)
    window = text.sliding_window if SLIDING in kinds and "indexed_attention" not in (text.layer_types or []) else None
    if SLIDING in kinds and window is None:
        window = text.index_topk
    chunk = text.attention_chunk_size if CHUNKED in kinds else None
    if len(assignment) > 1:
        raise HFConfigError(f"{text.model_type}: experts of different widths beside zero-computation experts")
    slots = gemm.pop(SLOTS, 0)
    measured = Measured(
        c_lin=tuple((k, gemm[k]) for k in COMPONENTS if gemm.get(k)),
        c_core=tuple(core.items()),
        c_assignment=next(iter(assignment), 0),
        routed_slots=slots,
    )
    return measured, kinds, window, chunk


def _attentions(attn: Any) -> list[Any]:
    """A layer's attention modules: none, one, or a list of them (LongCat-Flash's two per layer)."""
    from torch import nn

    if attn is None:
        return []
    return list(attn) if isinstance(attn, nn.ModuleList) else [attn]


def _add_mtp(model: Any, text: Any, depth: int, gemm: dict[str, int], core: dict[str, int], kinds: list[str]) -> None:
    """MTP modules as transformers builds them (``MtpModel``): each one's 2h → h projection plus
    Megatron's 3h for its norms (as the hand-written DeepSeek count), its block and the shared head."""
    import torch
    from transformers.modeling_layers import MtpModel

    with torch.device("meta"):
        mtp: Any = MtpModel(model, depth)
    layer: Any
    for layer in mtp.layers:
        h = layer.eh_proj.out_features
        gemm["mtp"] += TRAINED * (layer.eh_proj.in_features * layer.eh_proj.out_features + 3 * h)
        parts, attn, _ = _layer_parts(layer.mtp_block, text)
        for key, value in parts.items():
            gemm[key] += value
        if attn is not None:
            core[kinds[-1]] += _core_flops(attn, text)
        head: Any = mtp.shared_head
        gemm["logits"] += TRAINED * head.in_features * head.out_features


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (transformers' span several), cut to ``limit`` characters."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _config_classes(config: Any) -> list[type[Any]]:
    """The classes of a config and of its sub-configs (a wrapper's text and vision configs)."""
    subs = [getattr(config, name, None) for name in (getattr(type(config), "sub_configs", None) or {})]
    return list(dict.fromkeys([type(config), *(type(sub) for sub in subs if hasattr(sub, "to_dict"))]))


def _build(config: Any) -> tuple[Any, frozenset[str]]:
    """The model on the meta device (a wrapper: its image-text model, towers included), and the config
    attributes its modeling code read meanwhile."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    read: set[str] = set()
    originals = {cls: cls.__getattribute__ for cls in _config_classes(config)}

    def tracking(original: Any) -> Any:
        def get(self: Any, name: str) -> Any:
            read.add(name)
            return original(self, name)

        return get

    for cls, original in originals.items():
        cls.__getattribute__ = tracking(original)
    wrapper = config.get_text_config() is not config
    try:
        with torch.device("meta"):
            model = (AutoModelForImageTextToText if wrapper else AutoModelForCausalLM).from_config(config)
    except ValueError as exc:
        raise HFConfigError(
            f"{config.model_type}: transformers builds no causal LM from it ({_one_line(exc)})"
        ) from None
    except (TypeError, AttributeError, RuntimeError, AssertionError, IndexError, KeyError) as exc:
        raise HFConfigError(
            f"{config.model_type}: transformers could not build the model from this config "
            f"({type(exc).__name__}: {_one_line(exc)}); check its sizes against the checkpoint's config.json"
        ) from None
    finally:
        for cls, original in originals.items():
            cls.__getattribute__ = original
    return model, frozenset(read)


def _head_dim(model: Any, text: Any) -> int | None:
    """The head width shown with the model (the count itself is in ``measured``)."""
    for layer in _decoder_layers(model):
        attn = next((getattr(layer, n) for n in ATTENTION_PARTS if hasattr(layer, n)), None)
        if attn is not None and isinstance(getattr(attn, "head_dim", None), int):
            return int(attn.head_dim)
    return _int_attr(text, "head_dim")


def _first_width(text: Any) -> int | None:
    """The first layer's MLP width where the config lists one per layer (Gemma 3n), for display."""
    widths = getattr(text, "intermediate_size", None)
    return widths[0] if isinstance(widths, list) and widths and isinstance(widths[0], int) else None


def _int_attr(text: Any, key: str) -> int | None:
    value = getattr(text, key, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def spec_from_structure(cfg: Mapping[str, Any], tp: int = 1) -> ModelSpec:
    """A :class:`ModelSpec` for any model_type transformers builds, counted from its modules."""
    mt = cfg.get("model_type")
    if not isinstance(mt, str):
        raise HFConfigError(f"config.json: 'model_type' must be a string, got {mt!r}")
    if tp != 1:  # the head is read as built: Megatron's padding of the vocabulary per TP rank is not applied
        raise HFConfigError(f"model_type {mt!r} is counted from its structure, with the vocabulary unpadded: give tp 1")
    if mt in TIMM_TOWERS and importlib.util.find_spec("timm") is None:
        raise HFConfigError(
            f"model_type {mt!r}: transformers builds {TIMM_TOWERS[mt]}, through timm, which is not installed; "
            "pip install timm (it needs torchvision) to count it"
        )
    if mt in THINKERS:
        return _thinker_spec(cfg, mt, tp)
    cls = config_class(mt)
    refusals: tuple[type[BaseException], ...] = (ValueError, TypeError)
    try:  # transformers' strict config dataclasses raise huggingface_hub's own errors
        from huggingface_hub.errors import StrictDataclassError

        refusals += (StrictDataclassError,)
    except ImportError:
        pass
    try:
        # a copy: transformers rewrites old sub-config model types in place (Qwen3.5's vision_config)
        config = cls(**copy.deepcopy({k: v for k, v in cfg.items() if k != "model_type"}))
    except refusals as exc:  # transformers' own checks of the config
        raise HFConfigError(f"{mt} config.json: transformers' {cls.__name__} refuses it: {_one_line(exc)}") from None
    text = config.get_text_config()
    wrapper = text is not config
    if wrapper:
        _check_wrapper(cfg, cls, mt)
    _notice_missing_sizes(cfg.get("text_config") or {} if wrapper else cfg, text, "text_config." if wrapper else "")
    if getattr(text, "index_topk", None) and getattr(text, "layer_types", None) is None:
        raise HFConfigError(f"{mt} config.json: 'index_topk' is set without layer_types naming the indexed layers")
    model, read = _build(config)
    check_keys(cfg, mt, read=read)
    vision, tower_modules = vision_from_structure(model, mt) if wrapper else (None, [])
    audio, audio_modules = audio_from_structure(model, mt, towers(model)) if wrapper else (None, [])
    measured, kinds, window, chunk = measure(model, text, (*tower_modules, *audio_modules))
    notes = _not_built(cfg.get("text_config") if wrapper else cfg, text.model_type)
    heads = text.num_attention_heads
    hidden = text.hidden_size
    vocab = model.get_output_embeddings().out_features
    from packscope.core.hf_config import _largest_pow2_divisor

    try:
        spec = ModelSpec(
            layers=len(kinds),
            hidden=hidden,
            heads=heads,
            ffn=_int_attr(text, "intermediate_size") or _first_width(text) or 4 * hidden,
            vocab=vocab,
            head_dim=_head_dim(model, text) if hidden % heads else None,
            layer_kinds=tuple(kinds),
            window=window,
            chunk=chunk,
            mtp_depth=_mtp_depth(text),
            measured=measured,
            vision=vision,
            vocab_divisor=_largest_pow2_divisor(vocab),
            tp=tp,
            name=f"{mt} (structural)",
            not_counted=notes,
            audio=audio,
        )
    except ValueError as exc:
        raise HFConfigError(f"{mt} config.json: {exc}") from None
    return spec


def _thinker_spec(cfg: Mapping[str, Any], mt: str, tp: int) -> ModelSpec:
    """An omni model counted as its thinker (``THINKERS``), the keys beside it checked as for any model."""
    key, thinker_type = THINKERS[mt]
    thinker = _given_sub_config(cfg, key, mt)
    given = thinker.get("model_type", thinker_type)
    if given != thinker_type:
        raise HFConfigError(f"{mt} config.json: '{key}.model_type' is {given!r}, not {thinker_type!r}")
    # the wrapper's own keys as any model's; the talker's and code2wav's configs are not read: nothing
    # of them runs in training, so no key of theirs can change the count
    subs = set(getattr(config_class(mt), "sub_configs", None) or {})
    check_keys({k: v for k, v in cfg.items() if k not in subs}, mt)
    spec = spec_from_structure({**thinker, "model_type": thinker_type}, tp=tp)
    return dataclasses.replace(spec, name=f"{mt} (structural: the thinker)")


def _not_built(cfg: Any, text_type: str) -> tuple[str, ...]:
    """What the checkpoint holds that transformers does not build (``NOT_BUILT``), as notes."""
    if not isinstance(cfg, Mapping):
        return ()
    return tuple(
        note.format(cfg[key]) for (t, key), note in NOT_BUILT.items() if t == text_type and note and cfg.get(key)
    )


def _check_wrapper(cfg: Mapping[str, Any], cls: type[Any], mt: str) -> None:
    """A wrapper's decoder and towers must be the checkpoint's: a missing or empty sub-config would
    be transformers' default one. A tower the class marks optional (Gemma 4's) is not built when
    its sub-config is absent."""
    optional = getattr(cls, "sub_configs_defaults", None) or {}
    for key in ("text_config", *_TOWER_CONFIGS):
        if getattr(optional.get(key), "optional", False) and cfg.get(key) is None:
            continue
        if key in (getattr(cls, "sub_configs", None) or {}):
            _given_sub_config(cfg, key, mt)


def _given_sub_config(cfg: Mapping[str, Any], key: str, mt: str) -> Mapping[str, Any]:
    """The sub-config ``key`` as the checkpoint gives it: a missing or empty one would be
    transformers' default, not the checkpoint's."""
    value = cfg.get(key)
    if not isinstance(value, Mapping) or not value:
        what = "is missing" if value is None else "is empty" if isinstance(value, Mapping) else "is no object"
        raise HFConfigError(
            f"{mt} config.json: '{key}' {what}; transformers would build its default, which is not the "
            f"checkpoint's: give the checkpoint's {key}"
        )
    return value


def spec_from_any_hf_dict(cfg: Mapping[str, Any], tp: int = 1, routed_fraction: float | None = None) -> ModelSpec:
    """The hand-written reader where there is one (it refuses the count-changing fields it does not
    read, the relabelled DeepSeek-V3.2 and Gemma 4 ones among them); else the count from the
    model's structure, which refuses any key transformers' config class does not define.

    ``routed_fraction``: for a model with zero-computation experts (LongCat-Flash), the assumed
    fraction of top-k slots that go to real experts (``ModelSpec.with_routed_fraction``); without it
    such a model's FLOPs raise, saying so, and the HF callback measures the routing instead. Refused
    for any other model."""
    from packscope.core.hf_config import spec_from_hf_dict
    from packscope.core.hf_fields import UnknownModelType

    if not isinstance(cfg, Mapping):
        raise HFConfigError(f"a config is a JSON object, got {type(cfg).__name__}")
    try:
        spec = spec_from_hf_dict(cfg, tp=tp)
    except UnknownModelType:
        spec = spec_from_structure(cfg, tp=tp)
    return spec if routed_fraction is None else spec.with_routed_fraction(routed_fraction)


def read_any_hf_config(path: str | Path, tp: int = 1, routed_fraction: float | None = None) -> ModelSpec:
    """``spec_from_any_hf_dict`` of a ``config.json`` (or a directory holding one)."""
    from packscope.core.hf_config import load_config_json

    return spec_from_any_hf_dict(load_config_json(path), tp=tp, routed_fraction=routed_fraction)


def spec_from_any_hf_config(config: Any, tp: int = 1, routed_fraction: float | None = None) -> ModelSpec:
    """``spec_from_any_hf_dict`` of a loaded transformers config (``model.config``) or a dict."""
    from packscope.core.hf_config import config_dict

    return spec_from_any_hf_dict(config_dict(config), tp=tp, routed_fraction=routed_fraction)


__all__ = [
    "HARMLESS_KEYS",
    "check_keys",
    "measure",
    "read_any_hf_config",
    "spec_from_any_hf_config",
    "spec_from_any_hf_dict",
    "spec_from_structure",
]
