"""Model FLOPs for packed (THD) and padded (BSHD) batches.

Pure Python on purpose: the backend re-applies the same formula to stored raw sums and must not
import torch. The accounting (see docs/flops.md) is GEMM work only, forward plus backward,
2 FLOPs per multiply-add:

    FLOPs = T * c_lin + Σ_kind S2_kind * c_core_kind

where T is the number of tokens that drive the linear layers and S2_kind the attention sum of one
layer kind (full causal, sliding window, chunked; packscope.core.attention). A model whose layers
are all full attention has one sum, S2, and the historical ``flops(T, S2)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from packscope.core.attention import (
    ATTENTION_KINDS,
    ATTENTION_SUMS,
    CHUNKED,
    FULL,
    LAYER_KINDS,
    LINEAR,
    SLIDING,
    VIEWS,
    attention_sums,
    check_packs,
)
from packscope.core.audio import AudioSpec
from packscope.core.audio_gemma4 import Gemma4AudioSpec
from packscope.core.audio_sums import audio_spec_from_dict
from packscope.core.model_fields import (
    MAX_MODEL_SIZE,
    check_bool,
    check_flags,
    check_int,
    check_kinds,
    check_optional_int,
    dict_fields,
    nested_from_dict,
)
from packscope.core.vision import VisionSpec

# C_lin's parts (c_lin_by_component); each also names what the independent check reads.
COMPONENTS = (
    "attention",
    "linear_attention",
    "linear_attention_state",
    "dense_mlp",
    "moe_routed",
    "moe_shared",
    "per_layer_inputs",  # Gemma 3n / Gemma 4: the per-layer embedding's projection and gates
    "altup",  # Gemma 3n: AltUp's router, coefficients, stream mixing and stream projections
    "laurel",  # Gemma 3n: the low-rank residual
    "multimodal_embed",  # Gemma 3n's wrapper: embed_vision's and embed_audio's projection of every text token
    "mtp",
    "logits",
)


def flops(tokens: Any, seqlen_sq_sum: Any, c_lin: Any, c_core: Any) -> Any:
    """FLOPs(T, S2) = T·c_lin + S2·c_core, for ints, floats and SQL expressions alike."""
    return tokens * c_lin + seqlen_sq_sum * c_core


def flops_triad(
    tokens: Any, real_tokens: Any, seqlen_sq_sum_bshd: Any, seqlen_sq_sum_thd: Any, c_lin: Any, c_core: Any
) -> dict[str, Any]:
    """The three counts packscope reports for a model whose layers are all full attention
    (docs/flops.md); ``flops_triad_by_kind`` is the general form:

    * ``bshd`` (baseline): every token slot, every pack one dense sequence;
    * ``thd`` (THD-corrected): every token slot, attention over the real documents only;
    * ``useful``: real tokens only, attention over the real documents.
    """
    return {
        "bshd": flops(tokens, seqlen_sq_sum_bshd, c_lin, c_core),
        "thd": flops(tokens, seqlen_sq_sum_thd, c_lin, c_core),
        "useful": flops(real_tokens, seqlen_sq_sum_thd, c_lin, c_core),
    }


def _is_zero(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def flops_by_kind(
    tokens: Any, sums: Mapping[str, Any], c_lin: Any, c_core_by_sum: Mapping[str, Any], view: str = "thd"
) -> Any:
    """T·c_lin + Σ_kind S2_kind·c_core_kind over one view's sums (``"thd"`` or ``"bshd"``).

    ``sums`` maps sum names (packscope.core.attention.SUM_NAMES) to values; ``c_core_by_sum`` maps
    the same names to FLOPs per unit (``ModelSpec.c_core_by_sum``). Only the sums with a coefficient
    are read, so a full-attention model needs no window or chunk sum. Only + and * are applied:
    ints, floats, numpy arrays and SQL expressions all work.
    """
    total = tokens * c_lin
    for names in ATTENTION_SUMS.values():
        name = names.name(view)
        coefficient = c_core_by_sum.get(name)
        if coefficient is None or _is_zero(coefficient):
            continue
        total = total + sums[name] * coefficient
    return total


# Each of the three counts: which tokens its linear term counts, which view of the attention sums.
TRIAD: dict[str, tuple[Literal["tokens", "real_tokens"], str]] = {
    "bshd": ("tokens", "bshd"),
    "thd": ("tokens", "thd"),
    "useful": ("real_tokens", "thd"),
}


def flops_triad_by_kind(
    tokens: Any, real_tokens: Any, sums: Mapping[str, Any], c_lin: Any, c_core_by_sum: Mapping[str, Any]
) -> dict[str, Any]:
    """The three counts (``bshd``, ``thd``, ``useful``) of ``flops_triad`` for any mix of layer kinds:
    the baseline takes each kind's BSHD sum (every pack one sequence), the other two the THD sums."""
    counted = {"tokens": tokens, "real_tokens": real_tokens}
    return {kind: flops_by_kind(counted[t], sums, c_lin, c_core_by_sum, view) for kind, (t, view) in TRIAD.items()}


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2), as transformers' DeepseekV3Attention
    builds it: q from ``q_a_proj`` (h → q_lora_rank) and ``q_b_proj`` (→ n·(nope + rope)), or one
    ``q_proj`` when ``q_lora_rank`` is None; ``kv_a_proj_with_mqa`` (h → kv_lora_rank + rope),
    ``kv_b_proj`` (kv_lora_rank → n·(nope + v)), ``o_proj`` (n·v → h)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    def __post_init__(self) -> None:
        check_int("mla.kv_lora_rank", self.kv_lora_rank, minimum=1)
        check_int("mla.qk_nope_head_dim", self.qk_nope_head_dim, minimum=0)
        check_int("mla.qk_rope_head_dim", self.qk_rope_head_dim, minimum=0)
        check_int("mla.v_head_dim", self.v_head_dim, minimum=1)
        check_optional_int("mla.q_lora_rank", self.q_lora_rank, minimum=1)
        if self.qk_head_dim < 1:
            raise ValueError("MLA needs qk_nope_head_dim + qk_rope_head_dim >= 1")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def projection_macs(self, hidden: int, heads: int) -> int:
        """Multiply-adds per token of one layer's projections."""
        q_out = heads * self.qk_head_dim
        q = hidden * q_out if self.q_lora_rank is None else hidden * self.q_lora_rank + self.q_lora_rank * q_out
        kv_a = hidden * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv_a + kv_b + heads * self.v_head_dim * hidden


@dataclass(frozen=True)
class LinearAttention:
    """A gated delta-net layer (Qwen3-Next's linear attention), as transformers' Qwen3NextGatedDeltaNet
    builds it: ``in_proj_qkvz`` (h → 2·key_dim + 2·value_dim), ``in_proj_ba`` (h → 2·value heads),
    a depthwise causal conv over 2·key_dim + value_dim channels (``conv_kernel`` taps) and
    ``out_proj`` (value_dim → h). The delta-rule state update has no module shape; it is counted
    as Megatron-LM counts it, 4·value heads·value_head_dim² multiply-adds per token
    (KKᵀ, VKᵀ, the state update and SQ; docs/flops.md, "Hybrids")."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4

    def __post_init__(self) -> None:
        for key in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim", "conv_kernel"):
            check_int(f"linear_attention.{key}", getattr(self, key), minimum=1)

    def projection_macs(self, hidden: int) -> int:
        """Multiply-adds per token of the projections and the conv (what the modules hold)."""
        key_dim = self.num_key_heads * self.key_head_dim
        value_dim = self.num_value_heads * self.value_head_dim
        projections = hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * self.num_value_heads + value_dim * hidden
        return projections + self.conv_kernel * (2 * key_dim + value_dim)

    def state_macs(self) -> int:
        """Multiply-adds per token of the delta-rule state update, in Megatron-LM's convention."""
        return 4 * self.num_value_heads * self.value_head_dim**2


# A measured coefficient may exceed the size bound of a width (a trillion-parameter model's per-token work).
MAX_COEFFICIENT = 2**62


def _coefficients(key: str, value: Any, known: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """A {name: FLOPs} object (or its pairs) as pairs in ``known``'s order, each name one of ``known``."""
    items = list(value.items()) if isinstance(value, Mapping) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"model field {key!r} must be an object of {{name: FLOPs}}, got {value!r}")
    pairs = {}
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ValueError(f"model field {key!r} must be an object of {{name: FLOPs}}, got {value!r}")
        name, flops = item
        if name not in known:
            raise ValueError(f"model field {key!r} names {name!r}; known: {', '.join(known)}")
        if isinstance(flops, bool) or not isinstance(flops, int) or not 0 <= flops <= MAX_COEFFICIENT:
            raise ValueError(f"model field {key}.{name} must be an integer from 0 to {MAX_COEFFICIENT}, got {flops!r}")
        pairs[name] = flops
    return tuple((name, pairs[name]) for name in known if name in pairs)


@dataclass(frozen=True)
class Measured:
    """The coefficients read off a model's own modules (the structural count,
    ``packscope.agent.hf_structure``) for a model no hand-written formula describes: ``c_lin`` the
    FLOPs per token of each C_lin component (COMPONENTS) and ``c_core`` the FLOPs per unit of each
    attention kind's sum, both forward and backward as the model runs them. When set they replace
    the formula's ``c_lin_by_component`` and ``c_core_by_kind``; the plain fields stay for display."""

    c_lin: tuple[tuple[str, int], ...]
    c_core: tuple[tuple[str, int], ...] = ()
    # Routed experts beside zero-computation ones (LongCat-Flash): which real expert a top-k slot
    # goes to, if any, depends on the routing, so ``c_lin`` leaves the routed experts out and the
    # work is ``c_assignment`` (one real expert's GEMMs for one token, forward and backward) per
    # assignment the router made to a real expert; ``routed_slots`` is the top-k slots per token
    # over the MoE layers (a token's assignments are at most that many). 0: no such layer.
    c_assignment: int = 0
    routed_slots: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "c_lin", _coefficients("measured.c_lin", self.c_lin, COMPONENTS))
        object.__setattr__(self, "c_core", _coefficients("measured.c_core", self.c_core, ATTENTION_KINDS))
        for key in ("c_assignment", "routed_slots"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COEFFICIENT:
                raise ValueError(f"model field measured.{key} must be an integer from 0 to {MAX_COEFFICIENT}")
        if (self.c_assignment > 0) != (self.routed_slots > 0):
            raise ValueError("model fields measured.c_assignment and measured.routed_slots are set together")
        if self.c_assignment and dict(self.c_lin).get("moe_routed"):
            raise ValueError("a model priced per expert assignment has no fixed measured.c_lin.moe_routed")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"c_lin": dict(self.c_lin), "c_core": dict(self.c_core)}
        if self.c_assignment:  # only then: every other model's dict stays as it was
            out.update(c_assignment=self.c_assignment, routed_slots=self.routed_slots)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Measured:
        return cls(**dict_fields("model measured", cls, data, ()))


# Fields as stored before layer kinds existed: to_dict() always writes these, and only these for
# a model that needs nothing newer, so old and new agents send the same dict for the same model.
_CLASSIC_FIELDS = (
    "layers",
    "hidden",
    "heads",
    "ffn",
    "vocab",
    "kv_heads",
    "head_dim",
    "gated",
    "vocab_divisor",
    "tp",
    "moe_layers",
    "moe_ffn",
    "moe_topk",
    "moe_shared_ffn",
    "mtp_depth",
    "attn_output_gate",
)


# How ModelSpec checks its plain fields (its __post_init__ and model_json_schema both read these).
_POSITIVE = ("layers", "hidden", "heads", "ffn", "vocab", "vocab_divisor", "tp")
_OPTIONAL_POSITIVE = ("kv_heads", "head_dim", "moe_ffn", "window", "chunk")
_NONNEGATIVE = ("moe_topk", "moe_shared_ffn", "mtp_depth")
_FLAGS = ("gated", "attn_output_gate")


@dataclass(frozen=True)
class ModelSpec:
    """What the FLOPs formula needs to know about a decoder-only transformer.

    Each decoder layer has one attention kind (``layer_kinds``; None: all full causal): ``full``,
    ``sliding`` (window ``window``), ``chunked`` (chunk ``chunk``) or ``linear`` (linear attention,
    ``linear_attention``'s shapes, no attention sum). At most one window and one chunk size.
    """

    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    kv_heads: int | None = None  # None: no GQA (= heads)
    head_dim: int | None = None  # None: hidden // heads
    gated: bool = True  # SwiGLU/GeGLU: three matrices in the MLP
    vocab_divisor: int = 128  # padded vocabulary granularity (per TP rank)
    tp: int = 1
    # MoE: one flag per decoder layer (1 = MoE MLP); None means a dense model.
    moe_layers: tuple[int, ...] | None = None
    moe_ffn: int | None = None  # expert width, None: = ffn
    moe_topk: int = 0
    moe_shared_ffn: int = 0
    mtp_depth: int = 0
    attn_output_gate: bool = False
    layer_kinds: tuple[str, ...] | None = None  # one per decoder layer; None: all "full"
    window: int | None = None  # W of the "sliding" layers
    chunk: int | None = None  # C of the "chunked" layers
    mla: MLA | None = None  # multi-head latent attention instead of q/k/v projections
    linear_attention: LinearAttention | None = None  # shapes of the "linear" layers
    vision: VisionSpec | None = None  # a vision-language model's tower (packscope.core.vision)
    measured: Measured | None = None  # work read off the modules, replacing the formula (structural count)
    name: str = field(default="", compare=False)
    # What the count leaves out (a vision tower, a recurrent state update), for the user to see.
    not_counted: tuple[str, ...] = field(default=(), compare=False)
    # An audio tower (packscope.core.audio: Qwen3-Omni's; packscope.core.audio_gemma4: Gemma 4's),
    # priced from the record's audio sums (packscope.core.audio_sums).
    audio: AudioSpec | Gemma4AudioSpec | None = None

    def __post_init__(self) -> None:
        for key in _POSITIVE:
            check_int(key, getattr(self, key), minimum=1)
        for key in _OPTIONAL_POSITIVE:
            check_optional_int(key, getattr(self, key), minimum=1)
        for key in _NONNEGATIVE:
            check_int(key, getattr(self, key), minimum=0)
        for key in _FLAGS:
            check_bool(key, getattr(self, key))
        if self.mla is not None:
            if not isinstance(self.mla, MLA):
                raise ValueError(f"model field 'mla' must be an MLA, got {type(self.mla).__name__}")
            if self.kv_heads is not None or self.head_dim is not None:
                raise ValueError("an MLA model sets its head widths in 'mla'; leave 'kv_heads' and 'head_dim' unset")
            if self.attn_output_gate:
                raise ValueError("an attention output gate on MLA is not supported")
        elif self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) is not divisible by heads ({self.heads}); give head_dim")
        if self.moe_layers is not None:
            object.__setattr__(self, "moe_layers", check_flags("moe_layers", self.moe_layers, self.layers))
            if any(self.moe_layers) and self.moe_topk <= 0:
                raise ValueError("a model with MoE layers needs moe_topk >= 1")
        if self.layer_kinds is not None:
            kinds = check_kinds("layer_kinds", self.layer_kinds, self.layers, LAYER_KINDS)
            object.__setattr__(self, "layer_kinds", None if set(kinds) == {FULL} else kinds)
        self._check_kind_sizes()
        if self.measured is not None and not isinstance(self.measured, Measured):
            raise ValueError(f"model field 'measured' must be a Measured, got {type(self.measured).__name__}")
        if self.vision is not None and not isinstance(self.vision, VisionSpec):
            raise ValueError(f"model field 'vision' must be a VisionSpec, got {type(self.vision).__name__}")
        if self.audio is not None and not isinstance(self.audio, (AudioSpec, Gemma4AudioSpec)):
            raise ValueError(
                f"model field 'audio' must be an AudioSpec or a Gemma4AudioSpec, got {type(self.audio).__name__}"
            )
        if isinstance(self.not_counted, str) or not all(isinstance(x, str) for x in self.not_counted):
            raise ValueError("'not_counted' must be a sequence of strings")
        object.__setattr__(self, "not_counted", tuple(self.not_counted))

    def _check_kind_sizes(self) -> None:
        present = set(self.kinds)
        for kind, key in ((SLIDING, "window"), (CHUNKED, "chunk"), (LINEAR, "linear_attention")):
            if kind == LINEAR and self.measured is not None:
                continue  # a measured model's linear layers are in its measured work
            given = getattr(self, key) is not None
            if kind in present and not given:
                raise ValueError(f"the model has {kind!r} layers but no {key!r}")
            if given and kind not in present:
                raise ValueError(f"model field {key!r} is set but no layer is {kind!r} (see 'layer_kinds')")
        if self.linear_attention is not None and not isinstance(self.linear_attention, LinearAttention):
            raise ValueError("model field 'linear_attention' must be a LinearAttention")

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def d(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def g(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def padded_vocab(self) -> int:
        step = self.vocab_divisor * self.tp
        return math.ceil(self.vocab / step) * step

    @property
    def total_layers(self) -> int:
        """L' = decoder layers plus MTP layers."""
        return self.layers + self.mtp_depth

    @property
    def kinds(self) -> tuple[str, ...]:
        """The attention kind of each of the L' layers; an MTP layer takes the last layer's kind."""
        decoder = self.layer_kinds if self.layer_kinds is not None else (FULL,) * self.layers
        return decoder + (decoder[-1],) * self.mtp_depth

    def layers_of_kind(self, kind: str) -> int:
        """How many of the L' layers have attention of ``kind``."""
        return self.kinds.count(kind)

    @property
    def full_attention_only(self) -> bool:
        """True when the one full-attention sum S2 is all the attention there is (no sliding or
        chunked layer; linear layers have no sum). Only then do ``flops``/``triad`` apply."""
        return not {SLIDING, CHUNKED} & set(self.kinds)

    @property
    def moe_layer_count(self) -> int:
        """MoE layers among L'; an MTP layer has the type of the last decoder layer."""
        if not self.moe_layers:
            return 0
        return sum(self.moe_layers) + self.mtp_depth * self.moe_layers[-1]

    # -- the formula ---------------------------------------------------------------------------
    def attention_projection_macs(self) -> int:
        """Multiply-adds per token of one softmax-attention layer's projections."""
        h = self.hidden
        if self.mla is not None:
            return self.mla.projection_macs(h, self.heads)
        q, k = self.d * self.heads, self.d * self.g
        return h * (q + 2 * k) + q * h + (h * q if self.attn_output_gate else 0)

    @property
    def routing_dependent(self) -> bool:
        """True when the routed experts' work depends on the routing (zero-computation experts,
        LongCat-Flash): C_lin is then not known from the model alone. Give the fraction of top-k
        slots that go to real experts (``with_routed_fraction``), or measure the assignments
        (the agent does: the record's ``expert_assignments``, priced at ``c_assignment``)."""
        return self.measured is not None and self.measured.c_assignment > 0

    @property
    def c_assignment(self) -> int:
        """FLOPs of one (token, slot) assignment to a real expert (forward + backward); 0 for a
        model whose routed work is fixed by its top-k."""
        return self.measured.c_assignment if self.measured is not None else 0

    def with_routed_fraction(self, fraction: float) -> ModelSpec:
        """This model with the routed experts' work fixed by an assumption: ``fraction`` of the
        top-k slots go to real experts (the rest to zero-computation ones), so C_lin's
        ``moe_routed`` is fraction x the slots x c_assignment, rounded to the FLOP."""
        if not self.routing_dependent:
            raise ValueError(
                f"{self.name or 'this model'} has no zero-computation experts: its routed work is fixed by its "
                "top-k, and a routed fraction does not apply"
            )
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
            raise ValueError(f"the routed fraction is a number from 0 to 1, got {fraction!r}")
        assert self.measured is not None
        routed = round(fraction * self.measured.routed_slots * self.measured.c_assignment)
        fixed = dict(self.measured.c_lin)
        measured = Measured(c_lin=tuple({**fixed, "moe_routed": routed}.items()), c_core=self.measured.c_core)
        note = (
            f"the routed experts at an assumed {fraction:g} of the top-k slots going to real experts "
            "(the rest to zero-computation experts)"
        )
        return dataclasses.replace(self, measured=measured, not_counted=(*self.not_counted, note))

    def _routing_known(self) -> None:
        if self.routing_dependent:
            raise ValueError(
                f"{self.name or 'this model'} routes tokens to zero-computation experts: its routed work depends on "
                "the routing; give the fraction of top-k slots that go to real experts "
                "(ModelSpec.with_routed_fraction, `packscope flops --routed-fraction`)"
            )

    @property
    def c_lin_fixed_by_component(self) -> dict[str, int]:
        """``c_lin_by_component`` of the work that does not depend on the routing: for a
        routing-dependent model its routed experts (``moe_routed``) are 0, priced per assignment
        instead (``c_assignment``); for any other model the same as ``c_lin_by_component``."""
        if self.measured is not None:
            measured = dict(self.measured.c_lin)
            return {key: measured.get(key, 0) for key in COMPONENTS}
        return self.c_lin_by_component

    @property
    def c_lin_fixed(self) -> int:
        """FLOPs per token of the linear layers, the routed experts of a routing-dependent model left out."""
        return sum(self.c_lin_fixed_by_component.values())

    @property
    def c_lin_by_component(self) -> dict[str, int]:
        """C_lin split by what does the work (COMPONENTS), forward + backward. The MTP layers'
        attention and MLP are in ``attention`` / ``dense_mlp`` / ``moe_*``; ``mtp`` is their input
        projection (2h → h) plus Megatron's 3h for the two norms and the final norm. A measured
        model (``measured``) gives its own per-component work; a routing-dependent one has none
        without an assumed routed fraction (ValueError)."""
        if self.measured is not None:
            self._routing_known()
            measured = dict(self.measured.c_lin)
            return {key: measured.get(key, 0) for key in COMPONENTS}
        h = self.hidden
        f = 3 if self.gated else 2
        n_moe = self.moe_layer_count
        n_dense = self.total_layers - n_moe
        n_linear = self.layers_of_kind(LINEAR)
        linear = self.linear_attention
        linear_macs = linear.projection_macs(h) if linear is not None else 0
        state_macs = linear.state_macs() if linear is not None else 0
        moe_width = (self.moe_ffn if self.moe_ffn is not None else self.ffn) * self.moe_topk
        macs = {
            "attention": (self.total_layers - n_linear) * self.attention_projection_macs(),
            "linear_attention": n_linear * linear_macs,
            "linear_attention_state": n_linear * state_macs,
            "dense_mlp": h * f * self.ffn * n_dense,
            "moe_routed": h * f * moe_width * n_moe,
            "moe_shared": h * f * self.moe_shared_ffn * n_moe,
            "mtp": self.mtp_depth * (3 * h + 2 * h * h),
            "logits": h * self.padded_vocab * (self.mtp_depth + 1),
        }
        return {key: 6 * macs.get(key, 0) for key in COMPONENTS}  # Gemma 3n's parts: measured only

    @property
    def c_lin(self) -> int:
        """FLOPs per token of the linear layers (forward + backward)."""
        return sum(self.c_lin_by_component.values())

    @property
    def core_macs_per_pair(self) -> int:
        """Twice the multiply-adds of one (query, key) pair in one layer: QKᵀ over the query/key head
        width plus P·V over the value head width, all heads. Twice, so that MLA's halves stay whole."""
        if self.mla is not None:
            return self.heads * (self.mla.qk_head_dim + self.mla.v_head_dim)
        return 2 * self.heads * self.d

    @property
    def c_core_by_kind(self) -> dict[str, int]:
        """FLOPs per unit of each kind's attention sum (forward + backward, in the s²/2 convention):
        3 · (layers of the kind) · n · (d_qk + d_v). Kinds without layers are left out."""
        if self.measured is not None:
            return {kind: flops for kind, flops in self.measured.c_core if flops}
        per_layer = 3 * self.core_macs_per_pair
        counts = {kind: self.layers_of_kind(kind) for kind in ATTENTION_KINDS}
        return {kind: per_layer * n for kind, n in counts.items() if n}

    @property
    def c_core_by_sum(self) -> dict[str, int]:
        """``c_core_by_kind`` keyed by the sum names (both views): the coefficients that
        ``flops_by_kind`` and ``flops_triad_by_kind`` take."""
        out: dict[str, int] = {}
        for kind, coefficient in self.c_core_by_kind.items():
            names = ATTENTION_SUMS[kind]
            out[names.thd] = out[names.bshd] = coefficient
        return out

    @property
    def c_core(self) -> int:
        """FLOPs per unit of S2, the full-attention sum (QKᵀ and P·V, halved for the causal mask,
        forward + backward). For a model with sliding-window or chunked layers this is the
        coefficient of its full-attention layers only (0 when it has none); the other kinds' are in
        ``c_core_by_kind``."""
        return self.c_core_by_kind.get(FULL, 0)

    def _only_full(self, what: str) -> None:
        if not self.full_attention_only:
            kinds = sorted({SLIDING, CHUNKED} & set(self.kinds))
            raise ValueError(
                f"{what} counts full attention only, and this model has {' and '.join(kinds)} layers: "
                "use flops_by_kind / triad_by_kind with every kind's sum"
            )

    def flops(self, tokens: int, seqlen_sq_sum: int) -> int:
        """Exact integer FLOPs for T tokens and S2 = sum of squared sequence lengths (a model whose
        layers are all full attention; otherwise ``flops_by_kind``)."""
        self._only_full("ModelSpec.flops")
        return flops(tokens, seqlen_sq_sum, self.c_lin, self.c_core)

    def triad(self, tokens: int, real_tokens: int, seqlen_sq_sum_bshd: int, seqlen_sq_sum_thd: int) -> dict[str, int]:
        """``flops_triad`` with this model's coefficients (all layers full attention)."""
        self._only_full("ModelSpec.triad")
        return flops_triad(tokens, real_tokens, seqlen_sq_sum_bshd, seqlen_sq_sum_thd, self.c_lin, self.c_core)

    def flops_by_kind(self, tokens: Any, sums: Mapping[str, Any], view: str = "thd") -> Any:
        return flops_by_kind(tokens, sums, self.c_lin, self.c_core_by_sum, view)

    def triad_by_kind(self, tokens: Any, real_tokens: Any, sums: Mapping[str, Any]) -> dict[str, Any]:
        return flops_triad_by_kind(tokens, real_tokens, sums, self.c_lin, self.c_core_by_sum)

    # -- (de)serialisation for the wire ----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The model as JSON: the classic fields always, the newer ones only when set, so a model
        that needs nothing newer gives the same dict as before layer kinds existed."""
        out: dict[str, Any] = {key: getattr(self, key) for key in _CLASSIC_FIELDS}
        out["moe_layers"] = list(self.moe_layers) if self.moe_layers is not None else None
        if self.layer_kinds is not None:
            out["layer_kinds"] = list(self.layer_kinds)
        for key in ("window", "chunk"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.mla is not None:
            out["mla"] = {k: getattr(self.mla, k) for k in MLA.__dataclass_fields__}
        if self.linear_attention is not None:
            la = self.linear_attention
            out["linear_attention"] = {k: getattr(la, k) for k in LinearAttention.__dataclass_fields__}
        if self.vision is not None:
            out["vision"] = self.vision.to_dict()
        if self.audio is not None:
            out["audio"] = self.audio.to_dict()
        if self.measured is not None:
            out["measured"] = self.measured.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        """A model from its JSON dict, strictly: integers are integers (not bools, not strings,
        within 0..2**24; positive where 0 makes no sense), flags are bools, unknown keys are refused
        by name. Every dict ``to_dict()`` ever wrote loads and gives the same coefficients."""
        values = dict_fields("model", cls, data, ("moe_layers", "layer_kinds"), leave_out=("not_counted", "name"))
        values["mla"] = nested_from_dict(MLA, "mla", values.get("mla"))
        values["linear_attention"] = nested_from_dict(
            LinearAttention, "linear_attention", values.get("linear_attention")
        )
        if values.get("vision") is not None:
            values["vision"] = VisionSpec.from_dict(values["vision"])
        if values.get("audio") is not None:
            values["audio"] = audio_spec_from_dict(values["audio"])
        if values.get("measured") is not None:
            values["measured"] = Measured.from_dict(values["measured"])
        return cls(**values)


def model_json_schema() -> dict[str, Any]:
    """The JSON schema of a model dict as ``ModelSpec.from_dict`` reads it (for the OpenAPI
    document): the plain fields with the bounds __post_init__ checks, the lists, the nested parts
    as objects (each read strictly by its own from_dict). Rules across fields (a head width that
    divides, one flag per layer) are from_dict's alone: JSON Schema cannot say them."""

    def integer(minimum: int) -> dict[str, Any]:
        return {"type": "integer", "minimum": minimum, "maximum": MAX_MODEL_SIZE}

    def nullable(schema: dict[str, Any]) -> dict[str, Any]:
        return {"anyOf": [schema, {"type": "null"}]}

    properties: dict[str, Any] = {}
    properties.update({key: integer(1) for key in _POSITIVE})
    properties.update({key: nullable(integer(1)) for key in _OPTIONAL_POSITIVE})
    properties.update({key: integer(0) for key in _NONNEGATIVE})
    properties.update({key: {"type": "boolean"} for key in _FLAGS})
    # One entry per layer: what JSON Schema can say of it (the length, and the rule in words).
    per_layer = {
        "minItems": 1,
        "maxItems": MAX_MODEL_SIZE,
        "description": "one entry per layer: exactly `layers` of them",
    }
    flags = {"type": "array", "items": {"type": "integer", "enum": [0, 1]}, **per_layer}
    properties["moe_layers"] = nullable(flags)
    properties["layer_kinds"] = nullable(
        {"type": "array", "items": {"type": "string", "enum": list(LAYER_KINDS)}, **per_layer}
    )
    for key in ("mla", "linear_attention", "vision", "audio", "measured"):
        properties[key] = nullable({"type": "object"})
    required = [f.name for f in dataclasses.fields(ModelSpec) if f.default is dataclasses.MISSING]
    known = set(ModelSpec.__dataclass_fields__) - {"name", "not_counted"}
    assert set(properties) == known, sorted(set(properties) ^ known)  # a field added to ModelSpec is added here
    return {
        "title": "Model",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def moe_layer_pattern(layers: int, freq: int) -> tuple[int, ...]:
    """Megatron's integer ``moe_layer_freq``: layer i is MoE when i % freq == 0 (one in freq)."""
    if freq < 1:
        raise ValueError(f"moe layer frequency must be >= 1, got {freq}")
    return tuple(int(i % freq == 0) for i in range(layers))


@dataclass(frozen=True)
class FlopsBreakdown:
    """The three numbers of one batch (or interval), with the raw sums behind them (a model whose
    layers are all full attention; ``KindBreakdown`` is the general form)."""

    tokens: int
    real_tokens: int
    seqlen_sq_sum_bshd: int
    seqlen_sq_sum_thd: int
    flops_bshd: int
    flops_thd: int
    flops_useful: int

    @classmethod
    def compute(
        cls, model: ModelSpec, tokens: int, real_tokens: int, seqlen_sq_sum_bshd: int, seqlen_sq_sum_thd: int
    ) -> FlopsBreakdown:
        triad = model.triad(tokens, real_tokens, seqlen_sq_sum_bshd, seqlen_sq_sum_thd)
        return cls(
            tokens=tokens,
            real_tokens=real_tokens,
            seqlen_sq_sum_bshd=seqlen_sq_sum_bshd,
            seqlen_sq_sum_thd=seqlen_sq_sum_thd,
            flops_bshd=triad["bshd"],
            flops_thd=triad["thd"],
            flops_useful=triad["useful"],
        )


def packs_breakdown(model: ModelSpec, packs: list[list[int]], pack_length: int | None = None) -> FlopsBreakdown:
    """The three numbers for packs given as lists of document lengths (host-side calculator), for a
    model whose layers are all full attention; ``packs_breakdown_by_kind`` takes any model."""
    model._only_full("packs_breakdown")
    slots = check_packs(packs, pack_length)
    sums = attention_sums(packs, slots, kinds=(FULL,))
    return FlopsBreakdown.compute(
        model,
        tokens=slots * len(packs),
        real_tokens=sum(sum(p) for p in packs),
        seqlen_sq_sum_bshd=sums[ATTENTION_SUMS[FULL].bshd],
        seqlen_sq_sum_thd=sums[ATTENTION_SUMS[FULL].thd],
    )


@dataclass(frozen=True)
class KindBreakdown:
    """One batch's three numbers for any mix of layer kinds, with every sum and the FLOPs split:
    ``linear_flops[view]`` = T·C_lin and ``attention_flops[view][kind]`` = S2_kind·C_core,kind
    (views ``bshd``, ``thd``, ``useful``; the FLOPs of a view are their total)."""

    tokens: int
    real_tokens: int
    sums: dict[str, int]
    flops_bshd: int
    flops_thd: int
    flops_useful: int
    linear_flops: dict[str, int]
    attention_flops: dict[str, dict[str, int]]

    @classmethod
    def compute(cls, model: ModelSpec, tokens: int, real_tokens: int, sums: Mapping[str, int]) -> KindBreakdown:
        triad = model.triad_by_kind(tokens, real_tokens, sums)
        views = {"bshd": ("bshd", tokens), "thd": ("thd", tokens), "useful": ("thd", real_tokens)}
        attention = {
            view: {
                kind: sums[ATTENTION_SUMS[kind].name(sum_view)] * coefficient
                for kind, coefficient in model.c_core_by_kind.items()
            }
            for view, (sum_view, _) in views.items()
        }
        return cls(
            tokens=tokens,
            real_tokens=real_tokens,
            sums=dict(sums),
            flops_bshd=triad["bshd"],
            flops_thd=triad["thd"],
            flops_useful=triad["useful"],
            linear_flops={view: t * model.c_lin for view, (_, t) in views.items()},
            attention_flops=attention,
        )


def packs_breakdown_by_kind(model: ModelSpec, packs: list[list[int]], pack_length: int | None = None) -> KindBreakdown:
    """The three numbers and every attention sum for packs of document lengths, any model."""
    slots = check_packs(packs, pack_length)
    sums = attention_sums(packs, slots, window=model.window, chunk=model.chunk)
    return KindBreakdown.compute(model, tokens=slots * len(packs), real_tokens=sum(sum(p) for p in packs), sums=sums)


__all__ = [
    "COMPONENTS",
    "MAX_COEFFICIENT",
    "MAX_MODEL_SIZE",
    "MLA",
    "TRIAD",
    "VIEWS",
    "FlopsBreakdown",
    "KindBreakdown",
    "LinearAttention",
    "Measured",
    "ModelSpec",
    "flops",
    "flops_by_kind",
    "flops_triad",
    "flops_triad_by_kind",
    "moe_layer_pattern",
    "packs_breakdown",
    "packs_breakdown_by_kind",
]
