"""Do packed documents attend to each other? Checked once on a tiny copy of the model.

A packed row holds several documents; the model must keep each one to itself. Whether it does
depends on the model's code and on the batch form: transformers builds per-document masks from
``position_ids`` only when no 2-D ``attention_mask`` is given, flash-attention kwargs
(``cu_seq_lens_q``...) mean nothing to sdpa or eager attention, and in transformers 5.25
``GptOssModel`` never passes ``position_ids`` to its mask builders, so with sdpa or eager its
flattened documents attend to each other: the model trains across document boundaries and does
whole-row attention work.

The check asks the model itself, whatever its architecture: a copy of its config with small sizes
(same config class, the same layers, attention implementation, windows and flags; a few thousand
parameters a layer) is built on the CPU, run on one packed row of two documents in the batch form,
then run again with the first document's tokens changed. If the second document's logits move, the
documents reach each other. Once per batch form, at train begin for the forms data collators
make (``COMMON_FORMS``) and on first sight for any other; never on a training step's path.

Where they reach each other matters for the count: the masks that the copy's softmax-attention
calls receive are read (``_MaskReader``). A mask that lets the second document's queries see the
first one's keys is whole-row attention work; masks that all split the row while the logits still
move mean a layer carrying state along the row (a gated delta-net or another linear-attention or
convolutional mixer without the kernels that read document boundaries): a training bug, but the
attention work stays per document. With transformers 5.25 a forward that builds a KV cache gets no
per-document mask; the Trainer turns off only the top-level ``config.use_cache``, and the language
models of Qwen3-VL, Qwen3.5, InternVL, Qwen3-Omni and Qwen2.5-VL read their text config's, on by default.

A model that cannot be built small, an attention implementation that does not run on the CPU
(flash attention) or a forward that fails gives "not checked" and the reason, never an exception.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger("packscope.agent")

KEPT, CROSSED, NOT_CHECKED = "kept", "crossed", "not checked"
# The keys of a model's forward that say where documents start, in the order a form is named.
FLASH_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
FORM_KEYS = ("cu_seq_lens_q", "cu_seqlens", "position_ids", "attention_mask")
# What the data collators hand a model: DataCollatorWithFlattening (and TRL's padding_free) with
# and without its flash-attention kwargs, and position ids beside a padding mask.
COMMON_FORMS = (
    ("position_ids",),
    ("cu_seq_lens_q", "position_ids"),
    ("cu_seq_lens_q",),
    ("position_ids", "attention_mask"),
)
CPU_ATTENTION = ("eager", "sdpa")  # the implementations the check runs
DOCS = (7, 9)  # the packed row: two documents
# Relative change of the second document's logits above which the first one reached it: on the
# tiny configs of tests/core a crossing moved them by 0.11 to 1.2 of their largest value (through a
# gated delta-net's state alone, Qwen3-Next's and Qwen3.5's, by 0.026 to 0.039), and kept
# masks by exactly 0 (masked keys get a weight of exactly 0).
THRESHOLD = 1e-4
EAGER = "eager_attention_forward"  # each modeling file's own eager attention, looked up when called


@dataclass(frozen=True)
class Verdict:
    """What the check found for one batch form: KEPT, CROSSED or NOT_CHECKED, and why.
    ``whole_rows``: the attention masks let documents see each other, so each packed row is one
    sequence of attention work (False for a crossing through a layer's state alone)."""

    status: str
    detail: str
    whole_rows: bool = False

    @property
    def crossed(self) -> bool:
        return self.status == CROSSED


def form_of(batch: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The batch form of a forward's keyword arguments (FORM_KEYS present), None when its rows
    pack no documents (no boundaries nor positions: padded or plain rows)."""
    keys, packed = [], False  # read for every micro-batch (in the deferred reading): look-ups only
    for key in FORM_KEYS:
        value = batch.get(key)
        if not isinstance(value, torch.Tensor):
            continue
        if key == "attention_mask":
            if value.dim() == 2:
                keys.append(key)
            continue
        packed = True
        # Multimodal RoPE's [n, batch, length] positions (Qwen2.5-VL packs only with n = 4): named with n.
        keys.append(f"{key}[{value.shape[0]}]" if key == "position_ids" and value.dim() == 3 else key)
    return tuple(keys) if packed else None


def form_text(form: tuple[str, ...]) -> str:
    return " + ".join(form)


def _shrink(config: Any, hidden: int | None = None) -> None:
    """Small sizes, in place, for every width the config has; its layers, kinds, windows, flags and
    head dimension stay (rotary sections, partial rotary and the like depend on the head dim)."""
    # Per-layer widths (transformers' per_layer_config: Gemma 4's full layers' head_dim and KV heads)
    # raise on the global config unless asked for: read the global values, keep the per-layer head
    # widths, and give the per-layer KV heads one head, which divides the two query heads below.
    per_layer = vars(config).get("_heterogeneity_spec")
    if per_layer is not None:
        config.allow_global_per_layer_attribute_access = True
        for overrides in per_layer.per_layer_overrides.values():
            if "num_key_value_heads" in overrides:
                overrides["num_key_value_heads"] = 1
    heads = getattr(config, "num_attention_heads", None)
    if isinstance(heads, int) and heads > 0:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv = getattr(config, "num_key_value_heads", None)
        config.num_attention_heads = 2
        if isinstance(kv, int) and kv > 0:
            config.num_key_value_heads = 1 if kv < heads else 2
        if getattr(config, "head_dim", None):
            config.head_dim = head_dim
        config.hidden_size = hidden or 2 * head_dim
    elif hidden is not None and hasattr(config, "hidden_size"):
        config.hidden_size = hidden
    for key, small in (
        ("intermediate_size", 32),
        ("intermediate_size_mlp", 32),
        ("moe_intermediate_size", 16),
        ("shared_expert_intermediate_size", 16),
        ("n_inner", 32),
        ("q_lora_rank", 16),
        ("kv_lora_rank", 16),
        ("linear_num_key_heads", 1),
        ("linear_num_value_heads", 2),
        ("vocab_size", 128),
        ("vocab_size_per_layer_input", 128),  # Gemma 3n / 4: looked up with the same token ids
        ("hidden_size_per_layer_input", 8),
    ):
        if isinstance(getattr(config, key, None), int) and getattr(config, key) > 0:
            setattr(config, key, small)
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(getattr(config, key, None), int) and getattr(config, key) > 4:
            setattr(config, key, 4)
    for key in ("num_experts_per_tok", "top_k_experts"):  # Gemma 4 names its top-k top_k_experts
        if isinstance(getattr(config, key, None), int):
            setattr(config, key, min(getattr(config, key), 2))
    for key in ("n_group", "topk_group"):  # DeepSeek's grouped routing needs groups dividing the experts
        if isinstance(getattr(config, key, None), int):
            setattr(config, key, 1)
    vocab = getattr(config, "vocab_size", None)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        token = getattr(config, key, None)
        if isinstance(token, int) and isinstance(vocab, int) and token >= vocab:
            setattr(config, key, None)


def _fewer_layers(config: Any) -> None:
    """As few decoder layers as keep one of every layer kind (`layer_types`), at least two; every
    per-layer list is cut to match."""
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers <= 2:
        return
    kinds = getattr(config, "layer_types", None)
    keep = 2
    if isinstance(kinds, list) and len(kinds) == layers:
        keep = max(keep, max(kinds.index(kind) for kind in set(kinds)) + 1)
    for key, value in list(vars(config).items()):
        if isinstance(value, list) and len(value) == layers:
            setattr(config, key, value[:keep])
    config.num_hidden_layers = keep


def tiny_config(config: Any, fewer_layers: bool = True) -> Any:
    """A copy of `config` with small sizes (same class); a wrapper's towers get one small layer.
    With `fewer_layers`, only as many decoder layers as keep each layer kind."""
    tiny = copy.deepcopy(config)
    text = tiny.get_text_config() if hasattr(tiny, "get_text_config") else tiny
    _shrink(text)
    if fewer_layers:
        _fewer_layers(text)
    if text is not tiny:
        for name in ("vision_config", "audio_config"):
            tower = getattr(tiny, name, None)
            if tower is None:
                continue
            for key in ("depth", "num_hidden_layers"):
                if isinstance(getattr(tower, key, None), int):
                    setattr(tower, key, 1)
            _shrink(tower)
            if isinstance(getattr(tower, "out_hidden_size", None), int):
                tower.out_hidden_size = text.hidden_size
    return tiny


def _without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Training mode without randomness: dropout modules, and the dropout rates attention modules
    keep as floats, at 0."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)
    return model


class _MaskReader:
    """While the tiny copy runs, every softmax-attention call of its modules (transformers' sdpa
    function and each modeling file's eager one) is passed on unchanged, and whether the mask it
    received lets a query of the second document see a key of the first is kept in ``meets``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._modules = {id(m) for m in model.modules()}
        self._homes = {sys.modules[type(m).__module__] for m in model.modules()}
        self.meets: list[bool] = []

    def _reading(self, attend: Any) -> Any:
        def reading(
            module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any, **kwargs: Any
        ) -> Any:
            if id(module) in self._modules:
                self.meets.append(_documents_meet(query, key, attention_mask))
            return attend(module, query, key, value, attention_mask, *args, **kwargs)

        return reading

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        sdpa_home = ALL_ATTENTION_FUNCTIONS._global_mapping  # the class's mapping: every instance reads it
        undo: list[tuple[Any, str, Any]] = [(sdpa_home, "sdpa", sdpa_home["sdpa"])]
        sdpa_home["sdpa"] = self._reading(sdpa_home["sdpa"])
        for home in self._homes:
            eager = getattr(home, EAGER, None)
            if callable(eager):
                undo.append((home, EAGER, eager))
                setattr(home, EAGER, self._reading(eager))
        try:
            yield
        finally:
            for home, name, original in reversed(undo):
                if isinstance(home, dict):
                    home[name] = original
                else:
                    setattr(home, name, original)


def _documents_meet(query: torch.Tensor, key: torch.Tensor, mask: Any) -> bool:
    """Whether an attention call's mask lets a query of the packed row's second document see a key
    of its first (the row alone: keys and queries at positions 0..len-1)."""
    if not isinstance(mask, torch.Tensor):  # None: sdpa's causal flag or eager's no mask, the whole row
        return True
    q, k = query.shape[-2], key.shape[-2]
    mask = mask[..., :q, :k]
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    first = DOCS[0]
    return bool(allowed[..., first:, :first].any())


def _logits(output: Any) -> torch.Tensor:
    for name in ("logits", "last_hidden_state"):
        value = getattr(output, name, None)
        if isinstance(value, torch.Tensor):
            return value
    value = output[0] if isinstance(output, (tuple, list)) else output
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"the forward returned {type(output).__name__}, no logits")
    return value


def form_kwargs(form: tuple[str, ...], docs: tuple[int, ...] = DOCS) -> dict[str, torch.Tensor | int]:
    """One packed row of `docs` in batch form `form`, as the data collators make it."""
    total = sum(docs)
    kwargs: dict[str, torch.Tensor | int] = {}
    positions = torch.cat([torch.arange(n) for n in docs]).unsqueeze(0)
    for key in form:
        if key == "position_ids":
            kwargs["position_ids"] = positions
        elif key.startswith("position_ids["):  # the same positions on every multimodal axis
            kwargs["position_ids"] = positions.expand(int(key[len("position_ids[") : -1]), 1, total)
    if "attention_mask" in form:
        kwargs["attention_mask"] = torch.ones(1, total, dtype=torch.long)
    bounds = torch.tensor([0, *itertools.accumulate(docs)], dtype=torch.int32)
    if "cu_seq_lens_q" in form:
        kwargs.update(cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=max(docs), max_length_k=max(docs))
    if "cu_seqlens" in form:
        kwargs["cu_seqlens"] = bounds
    return kwargs


class CrossDocumentCheck:
    """The tiny copy of a model, built once (``build``), and a verdict per batch form (``verdict``,
    computed the first time a form is asked for)."""

    def __init__(self, config: Any, model_class: type) -> None:
        self.name = model_class.__name__
        self._config = config
        self._cls = model_class
        self._tiny: Any = None  # the tiny transformers model, None when it could not be built
        self._why_not: str | None = None  # why nothing can be checked
        self._verdicts: dict[tuple[str, ...], Verdict] = {}
        # transformers' forward builds a cache (and then no per-document mask) from config.use_cache
        # unless gradient checkpointing turns it off in training: the copy runs as the model trains.
        self._checkpointing = False
        self.seconds = 0.0  # CPU time the check has taken, for the log

    @classmethod
    def of(cls, model: Any) -> CrossDocumentCheck:
        """The check of a trainer's model (a PEFT wrapper's base model)."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        check = cls(getattr(base, "config", None), type(base))
        # transformers 5.25 names it activation checkpointing (gradient_... the older, deprecated alias)
        names = ("is_activation_checkpointing", "is_gradient_checkpointing")
        name = next((n for n in names if hasattr(type(base), n)), None)
        check._checkpointing = bool(getattr(base, name)) if name else False
        return check

    def build(self) -> None:
        started = time.perf_counter()
        try:
            self._tiny = self._build()
        except Exception as exc:  # noqa: BLE001 - any architecture: what cannot be built small is not checked
            self._why_not = f"a small copy of {self.name} could not be built ({type(exc).__name__}: {exc})"[:300]
        self.seconds += time.perf_counter() - started

    def _build(self) -> torch.nn.Module | None:
        from transformers import PreTrainedModel

        if self._config is None or not issubclass(self._cls, PreTrainedModel):
            self._why_not = f"{self.name} is not a transformers model"
            return None
        implementation = getattr(self._config, "_attn_implementation", None) or "eager"
        if implementation not in CPU_ATTENTION:
            self._why_not = f"its attention implementation {implementation!r} does not run on the CPU"
            return None
        try:
            model = self._instance(tiny_config(self._config))
        except Exception:  # noqa: BLE001 - layers tied to their number: all of them then, each small
            model = self._instance(tiny_config(self._config, fewer_layers=False))
        if self._checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()  # type: ignore[operator]
        return _without_dropout(model.float().train())

    def _instance(self, config: Any) -> torch.nn.Module:
        with torch.device("cpu"), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return self._cls(config)

    def verdict(self, form: tuple[str, ...]) -> Verdict:
        if form not in self._verdicts:
            started = time.perf_counter()
            try:
                with torch.device("cpu"):  # whatever default device the trainer set
                    self._verdicts[form] = self._check(form)
            except Exception as exc:  # noqa: BLE001 - the check must never stop a training run
                self._verdicts[form] = Verdict(NOT_CHECKED, f"the check failed ({type(exc).__name__}: {exc})"[:300])
            self.seconds += time.perf_counter() - started
        return self._verdicts[form]

    def _check(self, form: tuple[str, ...]) -> Verdict:
        if self._tiny is None:
            return Verdict(NOT_CHECKED, self._why_not or "the check was not built")
        try:
            run = self._run(form)
        except Exception as exc:  # noqa: BLE001 - a model that cannot run small is not checked
            return Verdict(NOT_CHECKED, f"a forward of a small {self.name} failed ({type(exc).__name__}: {exc})"[:300])
        if not run.first_moved > 0 or not run.scale > 0:
            return Verdict(NOT_CHECKED, f"a small {self.name}'s logits do not depend on its tokens")
        where = f"{self.name} with {form_text(form)} batches"
        if not run.crossed:
            return Verdict(KEPT, f"{where}: each packed document attends only to itself")
        if run.masks_split:
            return Verdict(
                CROSSED,
                f"{where}: packed documents reach each other (changing one document changes the next one's "
                "logits) through a layer that carries state along the row (linear attention or a "
                "convolution without kernels that read document boundaries), not through attention: every "
                "attention mask splits the row, so the attention work is per document",
            )
        why = "" if run.meets else " (no attention mask was seen: counted whole)"
        return Verdict(
            CROSSED,
            f"{where}: packed documents attend to each other (changing one document changes the next "
            f"one's logits; the attention masks do not split the row{self._cache_hint(form)}), so the model "
            f"trains across document boundaries and does whole-row attention{why}",
            whole_rows=True,
        )

    def _run(self, form: tuple[str, ...]) -> _Run:
        """Two training forwards of the packed row in `form`, the second with the first document's
        tokens changed (gradient checkpointing acts only with grad); the trainer's random state is
        left as it was (a router's jitter would draw from it)."""
        vocab = self._tiny.config.get_text_config().vocab_size
        generator = torch.Generator().manual_seed(0)
        total = sum(DOCS)
        ids = torch.randint(1, vocab, (1, total), generator=generator)
        changed = ids.clone()
        changed[0, : DOCS[0]] = torch.randint(1, vocab, (DOCS[0],), generator=generator)
        kwargs = form_kwargs(form)
        masks = _MaskReader(self._tiny)
        with torch.enable_grad(), torch.random.fork_rng(devices=[]), masks.reading():
            before = _logits(self._tiny(input_ids=ids, **kwargs)).float().detach()
            after = _logits(self._tiny(input_ids=changed, **kwargs)).float().detach()
        first, second = slice(0, DOCS[0]), slice(DOCS[0], total)
        return _Run(
            first_moved=(after[0, first] - before[0, first]).abs().max().item(),
            moved=(after[0, second] - before[0, second]).abs().max().item(),
            scale=before[0, second].abs().max().item(),
            meets=tuple(masks.meets),
        )

    def _cache_hint(self, form: tuple[str, ...]) -> str:
        """Why the masks may not split: transformers builds no per-document mask beside a KV cache,
        which a forward builds from use_cache (a wrapper's language model from its text config's,
        which the Trainer leaves on). Said with what the copy does once it is off."""
        text = self._tiny.config.get_text_config()
        if self._checkpointing or not getattr(text, "use_cache", False):
            return ""
        wrapper = text is not self._tiny.config
        setting = "model.config.get_text_config().use_cache" if wrapper else "model.config.use_cache"
        text.use_cache = False
        try:
            run = self._run(form)
        except Exception:  # noqa: BLE001 - only a hint: said without what follows
            return f": the forward builds a KV cache ({setting} is on), beside which no per-document mask is built"
        finally:
            text.use_cache = True
        if not run.crossed:
            then = "the documents stay apart"
        elif run.masks_split:
            then = "the masks split the row but a layer's state still carries documents along it"
        else:
            then = "the masks still do not split the row"
        trainer = "; the Trainer turns off only the top-level one" if wrapper else ""
        return (
            f": the forward builds a KV cache ({setting} is on{trainer}), beside which transformers builds "
            f"no per-document mask; with it off, {then}"
        )


@dataclass(frozen=True)
class _Run:
    """What two forwards of the packed row showed: how much the first and second documents' logits
    moved, the second's largest logit, and per attention call whether its mask let them meet."""

    first_moved: float
    moved: float
    scale: float
    meets: tuple[bool, ...]

    @property
    def crossed(self) -> bool:
        return self.moved > THRESHOLD * self.scale

    @property
    def masks_split(self) -> bool:
        return bool(self.meets) and not any(self.meets)


def check_common_forms(model: Any) -> CrossDocumentCheck:
    """Build the tiny copy and check COMMON_FORMS (on_train_begin); logs what it found."""
    check = CrossDocumentCheck.of(model)
    check.build()
    found = {form: check.verdict(form) for form in COMMON_FORMS}
    log.info(
        "packscope: cross-document check of %s (%.0f ms on the CPU): %s",
        check.name,
        1000 * check.seconds,
        "; ".join(f"{form_text(f)}: {v.status}" for f, v in found.items()),
    )
    return check


__all__ = [
    "COMMON_FORMS",
    "CROSSED",
    "KEPT",
    "NOT_CHECKED",
    "CrossDocumentCheck",
    "Verdict",
    "check_common_forms",
    "form_of",
    "tiny_config",
]
