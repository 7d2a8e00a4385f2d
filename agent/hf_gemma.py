"""The parts of Gemma 3n's and Gemma 4's decoders that no other decoder has, priced from their
modules for the structural count (docs/flops.md, "The structural count", step 3).

* **AltUp** (Gemma 3n, ``Gemma3nTextAltUp``): the layer works on one of ``altup_num_inputs`` = n
  copies of the residual stream and predicts / corrects the others. Per token and layer: the
  modality router (h → n) runs twice (in ``predict`` and in ``correct``), the prediction
  coefficients (n → n²) and the correction coefficients (n → n) once each, and ``predict`` mixes the
  n streams with its per-token n x n matrix, h · n² multiply-adds in a matmul no module holds.
  Beside the layers, the n - 1 extra streams are made and merged back by ``altup_projections`` and
  ``altup_unembed_projections`` (h → h each, once per token). All of it → ``altup``.
* **Laurel** (Gemma 3n, ``Gemma3nTextLaurelBlock``): a low-rank residual, h → r → h → ``laurel``.
* **Per-layer inputs** (Gemma 3n, Gemma 4 with ``hidden_size_per_layer_input``): the per-layer
  embedding is a lookup (no GEMM); the decoder's ``per_layer_model_projection`` (h → L · p, once
  per token) and each layer's ``per_layer_input_gate`` (h → p) and ``per_layer_projection``
  (p → h) → ``per_layer_inputs``.
* **Gemma 4's MoE block** (``enable_moe_block``): the layer's ``experts`` (fused 3-D weights, one
  expert's slices x ``top_k_experts``) → ``moe_routed``; its dense ``mlp`` runs on every token
  beside them, a shared expert → ``moe_shared``; the ``router`` is left out, as every router.

KV-shared layers (``num_kv_shared_layers``) need nothing here: transformers builds them without
``k_proj`` / ``v_proj``, so the walk counts their q and o projections, and they attend the shared
keys with the pairs of their own ``layer_types`` kind.
"""

from __future__ import annotations

from typing import Any

from packscope.core.hf_fields import HFConfigError

TRAINED = 6  # FLOPs per multiply-add, forward and backward
GEMMA_TYPES = ("gemma3n_text", "gemma4_text")
_PER_LAYER = ("per_layer_input_gate", "per_layer_projection")
_MODEL_PARTS = {
    "per_layer_model_projection": "per_layer_inputs",
    "altup_projections": "altup",
    "altup_unembed_projections": "altup",
}


def _linear_macs(module: Any) -> int:
    from torch import nn

    return sum(m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))


def _altup_macs(altup: Any, text: Any) -> int:
    """Multiply-adds per token of one layer's AltUp (the module docstring), from its modules."""
    router, predict, correct = altup.modality_router, altup.prediction_coefs, altup.correction_coefs
    h, n = router.in_features, router.out_features
    if (predict.in_features, predict.out_features, correct.in_features, correct.out_features) != (n, n * n, n, n):
        raise HFConfigError(f"{text.model_type}: AltUp's coefficients are not n → n² and n → n for n = {n} streams")
    if {id(m) for m in altup.modules() if _linear_macs(m)} - {id(altup), id(router), id(predict), id(correct)}:
        raise HFConfigError(f"{text.model_type}: AltUp ({type(altup).__name__}) holds GEMMs packscope does not place")
    return 2 * h * n + n * n * n + n * n + h * n * n


def layer_parts(layer: Any, text: Any, topk: Any) -> tuple[dict[str, int], set[int]]:
    """(FLOPs per token by component, ids of the children placed) of a Gemma 3n / Gemma 4 layer's
    own parts; ``topk`` gives the experts per token. Empty for any other model type."""
    if text.model_type not in GEMMA_TYPES:
        return {}, set()
    from packscope.agent.hf_structure import _expert_flops

    children = dict(layer.named_children())
    parts: dict[str, int] = {}
    placed: set[int] = set()
    if "altup" in children:
        parts["altup"] = TRAINED * _altup_macs(children["altup"], text)
        placed.add(id(children["altup"]))
    if "laurel" in children:
        parts["laurel"] = TRAINED * _linear_macs(children["laurel"])
        placed.add(id(children["laurel"]))
    gates = [children[name] for name in _PER_LAYER if name in children]
    if gates:
        parts["per_layer_inputs"] = TRAINED * sum(_linear_macs(g) for g in gates)
        placed |= {id(g) for g in gates}
    if "experts" in children:  # Gemma 4's MoE block: experts beside the dense MLP, in every layer
        if "mlp" not in children or "router" not in children:
            raise HFConfigError(f"{text.model_type}: an MoE block without its router or dense MLP is not read")
        parts["moe_routed"] = topk(text) * _expert_flops(children["experts"])
        parts["moe_shared"] = TRAINED * _linear_macs(children["mlp"])
        placed |= {id(children[name]) for name in ("experts", "mlp", "router")}
    return parts, placed


def model_parts(decoder: Any, text: Any) -> tuple[dict[str, int], list[Any]]:
    """(FLOPs per token by component, the modules placed) of the GEMMs a Gemma 3n / Gemma 4 decoder
    runs beside its layers, once per token; a bidirectional Gemma 4 is refused (its pairs are
    every pair of a document, which no attention kind here holds)."""
    if text.model_type not in GEMMA_TYPES:
        return {}, []
    if getattr(text, "use_bidirectional_attention", None) == "all":
        raise HFConfigError(
            f"{text.model_type}: use_bidirectional_attention 'all' (every token attends to every other) is a layer "
            "kind packscope does not price; the causal model (null) and 'vision' are counted"
        )
    parts: dict[str, int] = {}
    modules = []
    for name, component in _MODEL_PARTS.items():
        module = getattr(decoder, name, None)
        if module is not None:
            parts[component] = parts.get(component, 0) + TRAINED * _linear_macs(module)
            modules.append(module)
    return parts, modules


# Gemma 3n's wrapper embeds every text token through both multimodal embedders (the hard-token
# path of Gemma3nModel.forward, masked to the vision and audio ids afterwards, its backward dense).
_TEXT_EMBEDDERS = ("embed_vision", "embed_audio")


def wrapper_parts(model: Any, text: Any) -> tuple[dict[str, int], list[Any]]:
    """(FLOPs per text token, the modules placed) of what a Gemma 3n wrapper runs on every token beside
    its decoder: ``embed_vision`` and ``embed_audio`` (their projection) on the token ids. Empty for
    any other model (Gemma 4's embedders run on its towers' tokens only)."""
    inner = getattr(model, "model", None)
    if text.model_type != "gemma3n_text" or inner is None or not all(hasattr(inner, n) for n in _TEXT_EMBEDDERS):
        return {}, []
    embedders = [getattr(inner, n) for n in _TEXT_EMBEDDERS]
    return {"multimodal_embed": TRAINED * sum(_linear_macs(e) for e in embedders)}, embedders


__all__ = ["GEMMA_TYPES", "layer_parts", "model_parts", "wrapper_parts"]
