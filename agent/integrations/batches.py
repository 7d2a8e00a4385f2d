"""Which ``observe_batch`` form a dict batch is in, from its keys alone (no device read).

Shared by the integrations: Hugging Face models take their batch as keyword arguments with these
names, and Lightning users commonly keep the same names in their dict batches.

Precedence, cheapest and most exact first:

1. ``cu_seqlens`` or ``cu_seq_lens_q`` (HF padding-free collators with flash-attention kwargs,
   TRL ``padding_free``/``packing``) [+ ``cu_seqlens_padded``, ``token_mask``]: packed documents;
   each row of the tokens is one pack for the baseline.
2. ``position_ids`` restarting at 0 per document [+ a 2-D ``attention_mask`` for padding].
3. a 2-D ``attention_mask``: padded rows, one document per row.
4. the tokens' shape alone: plain fixed-length rows.

The tokens are ``input_ids``, else ``inputs_embeds`` (its first two dimensions), else ``tokens``;
a 1-D tensor is one row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import torch

from packscope.agent.audio import AUDIO_BATCH_KEYS
from packscope.agent.vision import BATCH_KEYS
from packscope.core.audio_sums import AnyAudioSpec
from packscope.core.vision import VISION_TOWERS, VisionSpec

TOKEN_KEYS = ("input_ids", "inputs_embeds", "tokens")
# Large tensors a kept micro-batch would hold past its step. The agent reads only their shapes:
# the HF callback keeps them as meta tensors (`shapes_of_heavy`); Lightning, whose batches go to a
# user's `batch_to_form`, observes such a step when it ends.
HEAVY_KEYS = frozenset(("inputs_embeds", "pixel_values", "pixel_values_videos", "input_features"))
PENDING_FORWARDS = 16  # micro-batches kept before they are observed anyway (bounds what is held)
T = TypeVar("T")
CU_KEYS = ("cu_seqlens", "cu_seq_lens_q")


def _tensor(batch: Mapping[str, Any], key: str) -> torch.Tensor | None:
    value = batch.get(key)
    return value if isinstance(value, torch.Tensor) else None


def rows_and_length(batch: Mapping[str, Any]) -> tuple[int, int] | None:
    """(rows, row_len) of the tokens the model runs, from the tensor's shape (host metadata)."""
    for key in TOKEN_KEYS:
        tokens = batch.get(key)
        if isinstance(tokens, torch.Tensor):
            batched = tokens.dim() >= (3 if key == "inputs_embeds" else 2)
            return (tokens.shape[0], tokens.shape[1]) if batched else (1, tokens.shape[0])
    return None


def shapes_of_heavy(batch: Mapping[str, Any]) -> dict[str, Any]:
    """`batch` with each large tensor (HEAVY_KEYS) as a meta tensor of its shape and dtype: what
    the agent reads of them (rows and length, the number of images) stays, their memory is not
    held past the step, and the step can wait for its interval's boundary like any other."""
    return {
        k: v.new_empty(v.shape, device="meta") if k in HEAVY_KEYS and isinstance(v, torch.Tensor) else v
        for k, v in batch.items()
    }


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 1 else t.reshape(-1)


def observe_kwargs(batch: Mapping[str, Any]) -> dict[str, Any] | None:
    """``observe_batch`` keyword arguments for ``batch``; None when it names no tokens. Called
    for every micro-batch: dictionary look-ups and shapes only (no tensor op, no view)."""
    shape = rows_and_length(batch)
    if shape is None:
        return None
    for key in CU_KEYS:
        cu = batch.get(key)
        if isinstance(cu, torch.Tensor):
            form: dict[str, Any] = {"cu_seqlens": _flat(cu), "shape": shape}
            padded = _tensor(batch, "cu_seqlens_padded")
            if padded is not None:
                form["cu_seqlens_padded"] = _flat(padded)
            token_mask = _tensor(batch, "token_mask")
            if token_mask is not None:
                form["token_mask"] = token_mask
            return form
    mask = _tensor(batch, "attention_mask")
    if mask is not None and mask.dim() != 2:
        mask = None  # a 4-D custom mask says nothing the agent can count
    position_ids = _tensor(batch, "position_ids")
    if position_ids is not None and position_ids.dim() <= 2:  # 3-D: multimodal RoPE, not per document
        return {"position_ids": position_ids, "attention_mask": mask}
    if mask is not None:
        return {"attention_mask": mask}
    return {"shape": shape}


def image_kwargs(batch: Mapping[str, Any], vision: VisionSpec | None) -> dict[str, Any]:
    """A vision-language batch's images as ``observe_batch`` takes them, under the keys its
    tower's processor writes (``image_grid_thw``, ``image_sizes``, ``pixel_values``); nothing for
    a text model. Look-ups only: the tables are counted at the log boundary."""
    if vision is None:
        return {}
    if vision.cross_layers and batch.get("cross_attention_states") is not None:
        # The tower ran before this batch (its output passed in): neither its work nor the
        # cross-attention layers' pairs can be read from it, and a silent count would miss both.
        raise ValueError(
            "the batch holds cross_attention_states (the vision tower's output, computed outside the model's "
            "forward): packscope counts an mllama batch from its pixel_values, aspect_ratio_mask and "
            "cross_attention_mask; pass those instead"
        )
    return {key: batch[key] for key in BATCH_KEYS[VISION_TOWERS[vision.tower]] if batch.get(key) is not None}


def audio_kwargs(batch: Mapping[str, Any], audio: AnyAudioSpec | None) -> dict[str, Any]:
    """An omni batch's audio clips as ``observe_batch`` takes them, under the keys its tower's
    feature extractor writes (``AUDIO_BATCH_KEYS``), when the model runs its audio tower on them:
    transformers does only given ``input_features`` (Gemma 4: and its mask). Nothing for a model
    without an audio tower. Look-ups only: the masks are counted at the log boundary."""
    if audio is None or batch.get("input_features") is None:
        return {}
    return {key: batch[key] for key in AUDIO_BATCH_KEYS[audio.tower] if batch.get(key) is not None}


class PendingSteps(Generic[T]):
    """The ended steps' micro-batches, kept by reference and observed together, step by step in
    order: at the interval's boundary (the integration sets ``Agent.before_boundary`` to
    ``observe``), once PENDING_FORWARDS micro-batches are kept, after the first step (so a batch
    the integration cannot read fails at once), and at once for a step that holds a large tensor
    (``heavy``). One warm loop over many micro-batches costs a fraction of a cold call per
    micro-batch between the trainer's forwards (issue 21;
    docs/benchmarks/2026-12-01-h200.md#h200-2026-12-01-evening); the counts are the same, since
    the agent sums an interval's micro-batches in any order, as long as they are
    observed before its boundary."""

    def __init__(self, observe_step: Callable[[T], None], *, observe_full_at_step_end: bool = True) -> None:
        self._observe_step = observe_step
        # False: the integration observes a full store itself (`full`), at a moment the GPU is busy.
        self._observe_full_at_step_end = observe_full_at_step_end
        self._steps: list[T] = []
        self._kept = 0  # micro-batches in _steps
        self._observed = False  # a step with micro-batches has been observed: they are readable
        self.heavy = False  # the open step holds a large tensor (HEAVY_KEYS)

    @property
    def full(self) -> bool:
        """PENDING_FORWARDS micro-batches are kept: observe them."""
        return self._kept >= PENDING_FORWARDS

    def end_step(self, step: T, micro_batches: int) -> None:
        self._steps.append(step)
        self._kept += micro_batches
        if self.heavy or (self.full and self._observe_full_at_step_end) or not self._observed:
            self._observed = self._observed or self._kept > 0
            self.observe()

    def observe(self) -> None:
        steps, self._steps, self._kept, self.heavy = self._steps, [], 0, False
        for step in steps:
            self._observe_step(step)
