"""Turn a micro-batch of documents into model inputs, in either layout.

BSHD: one document per row, right-padded to pack_length. Causal attention already keeps real
tokens away from the padding, so the attention mask only marks padding for the loss and for the
agent.

THD: first-fit-decreasing into packs of pack_length, flattened to [1, n_packs * pack_length].
Two boundary tensors describe it, as Transformer Engine takes them:

* ``cu_seqlens``: cumulative real document lengths, the documents the model learns from;
* ``cu_seqlens_padded``: where each document starts in the flat stream. A document's span runs
  to the next start, so it also covers its alignment padding and, for the last document of a
  pack, the pack's padding. Every slot belongs to some span, which the attention kernels need
  (a slot outside every span would keep uninitialised output), and causality keeps real tokens
  from ever seeing the padding after them.

With ``static=True`` both tensors have a fixed number of entries, n_packs * max_docs_per_pack + 2,
so shapes never change between steps (CUDA graphs, no recompiles): the final padding becomes a
dummy tail sequence of its own and the last boundary repeats (zero-length sequences).

Position ids restart at 0 at every span, so RoPE sees each document as if it were alone. Labels
are the next token inside a document and -100 on its last token and on padding: nothing is
predicted across a document boundary.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

IGNORE = -100


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


def first_fit_decreasing(lengths: list[int], capacity: int, max_docs: int, align: int = 1) -> list[list[int]]:
    """Document indices per pack: longest first, each into the first pack with room for it."""
    packs: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        slot = round_up(lengths[i], align)
        if slot > capacity:
            raise ValueError(f"document {i} needs {slot} slots, more than the pack length {capacity}")
        for p, pack in enumerate(packs):
            if room[p] >= slot and len(pack) < max_docs:
                pack.append(i)
                room[p] -= slot
                break
        else:
            packs.append([i])
            room.append(capacity - slot)
    return packs


@dataclass
class Batch:
    """One micro-batch, with the host-side facts the trainer and the agent need as Python ints."""

    input_ids: torch.Tensor  # [1, T] (THD) or [rows, pack_length] (BSHD)
    position_ids: torch.Tensor
    labels: torch.Tensor  # -100 where nothing is predicted
    n_packs: int  # THD packs, or BSHD padded rows
    pack_length: int
    doc_lengths: list[int]  # in the order they sit in the batch
    label_tokens: int  # positions that carry a label
    # THD
    cu_seqlens: torch.Tensor | None = None  # int32, real lengths
    cu_seqlens_padded: torch.Tensor | None = None  # int32, span starts in the flat stream
    max_seqlen: int = 0  # longest span, for the varlen kernel (never read from the device)
    static: bool = False
    dummy_tail: bool = False  # static form with a non-empty padding tail
    token_mask: torch.Tensor | None = None  # [1, T] bool, True on real tokens
    # BSHD
    attention_mask: torch.Tensor | None = None  # [rows, pack_length], 1 on real tokens

    @property
    def layout(self) -> str:
        return "thd" if self.cu_seqlens is not None else "bshd"

    @property
    def tokens(self) -> int:
        """Token slots the model runs, padding included."""
        return self.n_packs * self.pack_length

    @property
    def real_tokens(self) -> int:
        return sum(self.doc_lengths)

    def to(self, device: torch.device) -> Batch:
        """Copy the tensors to ``device`` without making the host wait (pinned, non-blocking)."""
        moved: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                if device.type == "cuda":
                    value = value.pin_memory()
                moved[f.name] = value.to(device, non_blocking=True)
        return replace(self, **moved)


def pack_bshd(docs: list[torch.Tensor], pack_length: int) -> Batch:
    rows = len(docs)
    input_ids = torch.zeros(rows, pack_length, dtype=torch.long)
    labels = torch.full((rows, pack_length), IGNORE, dtype=torch.long)
    attention_mask = torch.zeros(rows, pack_length, dtype=torch.long)
    for r, doc in enumerate(docs):
        n = len(doc)
        if n > pack_length:
            raise ValueError(f"document {r} has {n} tokens, more than the pack length {pack_length}")
        input_ids[r, :n] = doc
        labels[r, : n - 1] = doc[1:]
        attention_mask[r, :n] = 1
    lengths = [len(d) for d in docs]
    return Batch(
        input_ids=input_ids,
        position_ids=torch.arange(pack_length).expand(rows, pack_length).contiguous(),
        labels=labels,
        n_packs=rows,
        pack_length=pack_length,
        doc_lengths=lengths,
        label_tokens=sum(lengths) - rows,
        attention_mask=attention_mask,
    )


def pack_thd(
    docs: list[torch.Tensor],
    pack_length: int,
    n_packs: int | None = None,
    max_docs_per_pack: int = 64,
    align: int = 1,
    static: bool = False,
) -> Batch:
    """Pack ``docs`` into ``n_packs`` packs (None: as many as first-fit-decreasing needs)."""
    if not docs:
        raise ValueError("pack_thd needs at least one document")
    packs = first_fit_decreasing([len(d) for d in docs], pack_length, max_docs_per_pack, align)
    if n_packs is None:
        n_packs = len(packs)
    elif len(packs) > n_packs:
        raise ValueError(
            f"{len(docs)} documents need {len(packs)} packs of {pack_length} "
            f"(at most {max_docs_per_pack} documents each), but only {n_packs} were given"
        )
    total = n_packs * pack_length
    order = [i for pack in packs for i in pack]
    lengths = [len(docs[i]) for i in order]

    # Documents sit in their pack's slots, in first-fit-decreasing order; each span runs to the
    # next start. Static shapes give the final padding a span of its own: the dummy tail.
    starts = []
    for p, pack in enumerate(packs):
        offset = p * pack_length
        for i in pack:
            starts.append(offset)
            offset += round_up(len(docs[i]), align)
    last_end = starts[-1] + round_up(lengths[-1], align)
    tail = total - last_end if static else 0
    span_starts = starts + ([last_end] if tail else [])
    bounds = [*span_starts, total]
    span_lens = [b - a for a, b in itertools.pairwise(bounds)]

    input_ids = torch.zeros(total, dtype=torch.long)
    labels = torch.full((total,), IGNORE, dtype=torch.long)
    token_mask = torch.zeros(total, dtype=torch.bool)
    for i, start in zip(order, starts, strict=True):
        doc = docs[i]
        input_ids[start : start + len(doc)] = doc
        labels[start : start + len(doc) - 1] = doc[1:]
        token_mask[start : start + len(doc)] = True
    position_ids = torch.arange(total) - torch.repeat_interleave(
        torch.tensor(span_starts), torch.tensor(span_lens), output_size=total
    )

    cu = [0]
    for n in lengths + ([tail] if tail else []):
        cu.append(cu[-1] + n)
    if static:
        size = n_packs * max_docs_per_pack + 2
        cu += [cu[-1]] * (size - len(cu))
        bounds += [total] * (size - len(bounds))
    return Batch(
        input_ids=input_ids.unsqueeze(0),
        position_ids=position_ids.unsqueeze(0),
        labels=labels.unsqueeze(0),
        n_packs=n_packs,
        pack_length=pack_length,
        doc_lengths=lengths,
        label_tokens=sum(lengths) - len(lengths),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32),
        cu_seqlens_padded=torch.tensor(bounds, dtype=torch.int32),
        # Static shapes want a constant: every span fits a pack unless whole packs stay empty.
        max_seqlen=max(*span_lens, pack_length) if static else max(span_lens),
        static=static,
        dummy_tail=tail > 0,
        token_mask=token_mask.unsqueeze(0),
    )
