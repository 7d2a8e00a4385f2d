"""The loss per channel (a document's source: code, math, chat, web) of one micro-batch.

Both forms return a float64 (channels, 2) device tensor of (summed loss, labelled tokens) per
channel, which the agent averages over its interval.

* ``channel_loss_sums``: flat in the number of documents and free of host syncs. Token ->
  span ids come from ``repeat_interleave`` with ``output_size`` (so it need not read the total
  back), and sums and counts go into the buffer together with one ``index_add_``.
* ``channel_loss_sums_loop``: the per-document Python loop that loops used to have, kept for
  ``--legacy-channel-loss``: slicing by device scalars and a boolean mask costs three host
  syncs per document.

Spans are the THD packer's (``cu_seqlens_padded``: every slot belongs to one, padding and a
static form's dummy tail included) or BSHD rows; padding carries no label, so it adds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from packscope.trainer.data import Document
from packscope.trainer.packing import IGNORE, Batch, first_fit_decreasing


@dataclass
class ChannelBatch(Batch):
    """A batch that also carries its spans' channels, moved to the device along with it."""

    span_channels: torch.Tensor | None = None


def with_channels(batch: Batch, docs: list[Document], max_docs_per_pack: int, align: int) -> ChannelBatch:
    """``batch`` (packed from ``docs``, on the host) with the channel of each of its spans."""
    channels = span_channels(docs, batch, max_docs_per_pack, align)
    return ChannelBatch(**{f.name: getattr(batch, f.name) for f in fields(Batch)}, span_channels=channels)


def span_bounds(batch: Batch) -> torch.Tensor:
    """Where each span starts in the flat token stream, and the end: THD spans or BSHD rows."""
    if batch.layout == "thd":
        assert batch.cu_seqlens_padded is not None  # a THD batch carries its boundaries
        return batch.cu_seqlens_padded
    rows = torch.arange(batch.n_packs + 1, device=batch.input_ids.device) * batch.pack_length
    return rows.to(torch.int32)


def span_channels(docs: list[Document], batch: Batch, max_docs_per_pack: int, align: int) -> torch.Tensor:
    """The channel of every span of ``batch`` (packed from ``docs``), in span order, on the host.

    The THD packer sits documents in first-fit-decreasing order, which is recomputed here from
    the same lengths; spans past the documents (a dummy tail, zero-length repeats) get channel 0
    and hold no labels.
    """
    if batch.layout == "thd":
        packs = first_fit_decreasing([len(d) for d in docs], batch.pack_length, max_docs_per_pack, align)
        order = [i for pack in packs for i in pack]
        assert batch.cu_seqlens_padded is not None
        spans = batch.cu_seqlens_padded.numel() - 1
    else:
        order, spans = list(range(len(docs))), batch.n_packs
    assert [len(docs[i]) for i in order] == batch.doc_lengths, "documents are not in the packer's order"
    channels = [docs[i].channel for i in order]
    return torch.tensor(channels + [0] * (spans - len(channels)), dtype=torch.long)


def channel_loss_sums(
    token_losses: torch.Tensor,
    labels: torch.Tensor,
    bounds: torch.Tensor,
    channels_of_spans: torch.Tensor,
    channels: int,
) -> torch.Tensor:
    """(summed loss, labelled tokens) per channel, with no host sync and one ``index_add_``.

    ``token_losses`` and ``labels`` cover the flat token stream; ``bounds`` are the span
    boundaries (``span_bounds``) and ``channels_of_spans`` their channels, on the device.
    """
    token_losses, labels = token_losses.reshape(-1), labels.reshape(-1)
    total = token_losses.numel()
    lengths = (bounds[1:] - bounds[:-1]).long()
    spans = torch.arange(lengths.numel(), device=lengths.device)
    span_of_token = torch.repeat_interleave(spans, lengths, output_size=total)
    labelled = labels != IGNORE
    values = torch.stack([torch.where(labelled, token_losses.double(), 0.0), labelled.double()], dim=-1)
    sums = torch.zeros(channels, 2, dtype=torch.float64, device=token_losses.device)
    return sums.index_add_(0, channels_of_spans[span_of_token], values)


def channel_loss_sums_loop(
    token_losses: torch.Tensor,
    labels: torch.Tensor,
    bounds: torch.Tensor,
    channels_of_spans: torch.Tensor,
    channels: int,
) -> torch.Tensor:
    """The same sums, one document at a time, the way loops used to do it (three syncs each)."""
    token_losses, labels = token_losses.reshape(-1), labels.reshape(-1)
    sums = torch.zeros(channels, 2, dtype=torch.float64, device=token_losses.device)
    for i in range(channels_of_spans.numel()):
        start = bounds[i].item()  # sync
        end = bounds[i + 1].item()  # sync
        kept = token_losses[start:end][labels[start:end] != IGNORE]  # boolean mask: sync
        row = torch.zeros(1, 2, dtype=torch.float64, device=token_losses.device)
        row[0, 0] = kept.double().sum()
        row[0, 1] = kept.numel()
        sums.index_add_(0, channels_of_spans[i : i + 1], row)
    return sums
