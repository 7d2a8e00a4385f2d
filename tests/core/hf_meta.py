"""The independent check's instruments: what transformers itself builds and masks.

Nothing here uses packscope's formula. ``gemm_components`` reads the GEMM work per token off the
module shapes of a model built by transformers (on the meta device: no weights, no downloads);
``count_pairs_in_forward`` runs a tiny model on the CPU and counts, layer by layer, the (query,
key) pairs that the mask each attention call actually received lets through (in the form a model
splits documents with, or as the HF Trainer feeds a flattened row); ``mask_pairs``
counts the pairs of transformers' own mask builders (``create_*_mask``) for packed rows, in query
blocks so that real window and chunk sizes fit in memory.
"""

from __future__ import annotations

import sys
import warnings
from collections import defaultdict
from typing import Any

import torch
from torch import nn

warnings.filterwarnings("ignore", module="transformers")

from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText  # noqa: E402
from transformers.masking_utils import (  # noqa: E402
    AttentionMaskInterface,
    create_causal_mask,
    create_chunked_causal_mask,
    create_sliding_window_causal_mask,
    sdpa_mask,
)
from transformers.modeling_layers import MtpModel  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

# -- building ------------------------------------------------------------------------------------


def build(config: Any, device: str = "meta") -> nn.Module:
    """The model transformers builds for ``config`` (a wrapper gets its image-text class)."""
    wrapper = config.get_text_config() is not config
    cls = AutoModelForImageTextToText if wrapper else AutoModelForCausalLM
    with torch.device(device):
        return cls.from_config(config)


def config_from_dict(cfg: dict[str, Any]) -> Any:
    cfg = dict(cfg)
    return AutoConfig.for_model(cfg.pop("model_type"), **cfg)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    decoder = model.get_decoder()
    while not hasattr(decoder, "layers"):  # Llama 4's get_decoder() is the causal LM around it
        decoder = decoder.model
    return list(decoder.layers)


# -- GEMM work from module shapes ----------------------------------------------------------------

ROUTERS = ("gate", "router", "shared_expert_gate")  # routing GEMMs: not counted (docs/flops.md)


def _linear_macs(module: nn.Module) -> int:
    """Multiply-adds per token of every nn.Linear under ``module`` (a token passes each once), and
    of every causal nn.Conv1d (one output per channel and token: its weight's size)."""
    total = 0
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            total += sub.in_features * sub.out_features
        elif isinstance(sub, nn.Conv1d):
            total += sub.weight.numel()
    return total


def _expert_macs(experts: nn.Module) -> int:
    """Multiply-adds of one expert: the per-expert slice of each 3-D weight (biases are not GEMMs)."""
    weights = [p for p in experts.parameters(recurse=False) if p.dim() == 3]
    if not weights:
        raise AssertionError(f"{type(experts).__name__} holds no 3-D expert weights")
    return sum(p[0].numel() for p in weights)


def _mlp_parts(mlp: nn.Module, topk: int) -> dict[str, int]:
    experts = getattr(mlp, "experts", None)
    if experts is None:
        return {"dense_mlp": _linear_macs(mlp)}
    shared = [m for name, m in mlp.named_children() if name.startswith("shared_expert") and name not in ROUTERS]
    return {
        "moe_routed": topk * _expert_macs(experts),
        "moe_shared": sum(_linear_macs(m) for m in shared),
    }


def _layer_parts(layer: nn.Module, topk: int) -> dict[str, int]:
    parts: dict[str, int] = defaultdict(int)
    if hasattr(layer, "self_attn"):
        parts["attention"] += _linear_macs(layer.self_attn)
    if hasattr(layer, "linear_attn"):
        parts["linear_attention"] += _linear_macs(layer.linear_attn)
    mlp = getattr(layer, "mlp", None) or layer.feed_forward
    for key, value in _mlp_parts(mlp, topk).items():
        parts[key] += value
    return parts


def gemm_components(model: nn.Module, mtp: nn.Module | None = None) -> dict[str, int]:
    """FLOPs per token (forward + backward: 6 per multiply-add) of the decoder's GEMMs, split as
    packscope splits C_lin. ``mtp``: a transformers ``MtpModel`` whose layers a token also passes."""
    text = model.config.get_text_config()
    topk = getattr(text, "num_experts_per_tok", 0) or 0
    parts: dict[str, int] = defaultdict(int)
    for layer in decoder_layers(model):
        for key, value in _layer_parts(layer, topk).items():
            parts[key] += value
    head = model.get_output_embeddings()
    parts["logits"] += head.in_features * head.out_features
    if mtp is not None:
        for layer in mtp.layers:
            parts["mtp"] += layer.eh_proj.in_features * layer.eh_proj.out_features
            for key, value in _layer_parts(layer.mtp_block, topk).items():
                parts[key] += value
            parts["logits"] += mtp.shared_head.in_features * mtp.shared_head.out_features
    return {key: 6 * value for key, value in parts.items() if value}


def build_mtp(model: nn.Module, layers: int) -> nn.Module:
    with torch.device("meta"):
        return MtpModel(model, layers)


def core_macs_per_pair(model: nn.Module, layer_index: int) -> int:
    """Twice the multiply-adds of one (query, key) pair in one layer, from the attention module:
    all heads times (query/key head width + value head width)."""
    text = model.config.get_text_config()
    attn = decoder_layers(model)[layer_index].self_attn
    heads = text.num_attention_heads
    qk = getattr(attn, "qk_head_dim", None) or attn.head_dim
    v = getattr(attn, "v_head_dim", None) or attn.head_dim
    assert attn.o_proj.in_features == heads * v, "the output projection reads heads x value width"
    return heads * (qk + v)


def transformers_layer_kinds(model: nn.Module) -> list[str]:
    """Each decoder layer's mask kind as the modeling code picks it: from ``config.layer_types``
    where the model keys its masks by it, else one mask for all layers (Mistral, Mixtral, Qwen3-MoE)."""
    text = model.config.get_text_config()
    types = getattr(text, "layer_types", None)
    if types is not None and getattr(text, "model_type", "") != "qwen3_moe":
        return list(types)
    kind = "sliding_attention" if getattr(text, "sliding_window", None) is not None else "full_attention"
    return [kind] * text.num_hidden_layers


# -- pairs let through by transformers' masks ----------------------------------------------------

PAIRS = "packscope_pairs"
COUNT = "packscope_count"
_BLOCK = 512


def _count_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, **kwargs):
    """A mask interface that returns the number of allowed pairs, built in query blocks."""
    total = 0
    for start in range(0, q_length, _BLOCK):
        rows = min(_BLOCK, q_length - start)
        block = sdpa_mask(
            batch_size=batch_size,
            q_length=rows,
            kv_length=kv_length,
            q_offset=q_offset + start,
            kv_offset=kv_offset,
            mask_function=mask_function,
            attention_mask=kwargs.get("attention_mask"),
            allow_is_causal_skip=False,
            device=kwargs.get("device", "cpu"),
        )
        total += int(block.sum())
    return total


def _bool_mask(*args, **kwargs):
    kwargs["allow_is_causal_skip"] = False
    kwargs.pop("dtype", None)
    kwargs.pop("config", None)
    kwargs.pop("use_vmap", None)
    kwargs.pop("local_size", None)
    return sdpa_mask(*args, **kwargs)


CALLS: list[tuple[int, int]] = []  # (layer index, pairs) of every attention call since the last clear


def _counting_attention(module, query, key, value, attention_mask, **kwargs):
    """Count the pairs of the boolean mask this layer received, then run the model's own eager
    attention with it (sinks and all)."""
    mask = attention_mask[..., : query.shape[-2], : key.shape[-2]]
    CALLS.append((module.layer_idx, int(mask[:, 0].sum())))
    additive = torch.zeros(mask.shape, dtype=query.dtype).masked_fill(~mask, torch.finfo(query.dtype).min)
    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager(module, query, key, value, additive, **kwargs)


AttentionMaskInterface.register(PAIRS, _count_mask)
AttentionMaskInterface.register(COUNT, _bool_mask)
AttentionInterface.register(PAIRS, _counting_attention)  # never called: masks only
AttentionInterface.register(COUNT, _counting_attention)

_CREATE = {
    "full_attention": create_causal_mask,
    "sliding_attention": create_sliding_window_causal_mask,
    "chunked_attention": create_chunked_causal_mask,
}


def position_ids(docs: list[int], pack_length: int) -> torch.Tensor:
    """Positions restarting at 0 for each document; a padding tail is one more sequence."""
    parts = [torch.arange(s) for s in docs]
    if pack_length > sum(docs):
        parts.append(torch.arange(pack_length - sum(docs)))
    return torch.cat(parts).unsqueeze(0)


def mask_pairs(config: Any, kind: str, docs: list[int], pack_length: int | None = None) -> int:
    """Pairs that transformers' mask for ``kind`` (an HF layer type) lets through in one packed row
    of ``docs``; with one document the row is unpacked (plain positions, no packing detected)."""
    text = config.get_text_config()
    text._attn_implementation = PAIRS
    length = pack_length or sum(docs)
    embeds = torch.empty(1, length, 1)
    pos = position_ids(docs, length)
    return _CREATE[kind](config=text, inputs_embeds=embeds, attention_mask=None, cache=None, position_ids=pos)


def count_pairs_in_forward(model: nn.Module, docs: list[int], as_trained: bool = False) -> dict[int, int]:
    """Run the model on one packed row of ``docs`` and return the pairs each layer's mask allowed.

    By default the row comes in the form the model splits documents with: no cache, and
    Qwen2.5-VL's ``[4, batch, length]`` positions (what the per-document sums are checked against).
    ``as_trained``: as the HF Trainer hands a DataCollatorWithFlattening row to the model, 2-D
    ``position_ids`` and no ``use_cache`` argument, the top-level ``config.use_cache`` off as the
    Trainer sets it (a wrapper's language model reads its text config's instead: with transformers
    5.25 Qwen3-VL, Qwen3.5, InternVL then build a KV cache and, beside it, no per-document mask)."""
    CALLS.clear()
    length = sum(docs)
    ids = torch.randint(0, model.config.get_text_config().vocab_size, (1, length))
    pos = position_ids(docs, length)
    kwargs: dict[str, Any] = {"use_cache": False}
    if as_trained:
        model.config.use_cache = False  # transformers.Trainer: model.config.use_cache = args.use_cache
        kwargs = {}
    elif model.config.model_type == "qwen2_5_vl":
        # Qwen2.5-VL packs only with [4, batch, length] positions: text positions, then the three
        # M-RoPE grids (modeling_qwen2_5_vl.py says so); plain 2-D positions attend across documents.
        pos = pos.expand(4, 1, length)
    with torch.no_grad():
        model(input_ids=ids, position_ids=pos, **kwargs)
    out: dict[int, int] = {}
    for layer, pairs in CALLS:
        assert layer not in out, f"layer {layer} attended twice"
        out[layer] = pairs
    return out
