"""Synthetic documents with realistic lengths and learnable content.

Lengths mix a chat-like short mode and a long mode (both log-normal), clipped to
[min_len, pack_length]. For content the vocabulary is split into ``rules`` bands, each with an
affine recurrence x' = (a*x + b) mod band that visits every token of its band; a document follows
one rule from a random start, and its rule fixes its source (its channel: code, math, chat,
web), so the stream and the channels are both seeded. The next token is a function of the current one, so a model first
learns which band a document lives in (loss -> ln(band)), then the transitions (loss -> 0): the
loss falls clearly within ~100 steps on the tiny preset.

Everything is drawn from one seeded generator, and the grouping of documents into steps does
not depend on the layout: THD and BSHD runs with the same seed train on identical documents.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from packscope.trainer.config import DataConfig
from packscope.trainer.packing import first_fit_decreasing, round_up

# The sources documents come from; the loss can be followed per source (--channel-loss).
CHANNELS = ("code", "math", "chat", "web")


@dataclass(frozen=True)
class Document:
    """One document: its tokens (1-D int64, on the host) and its source, an index in CHANNELS."""

    tokens: torch.Tensor
    channel: int = 0

    def __len__(self) -> int:
        return len(self.tokens)


class DocumentStream:
    """An endless, deterministic stream of documents."""

    def __init__(self, cfg: DataConfig, vocab: int, pack_length: int, seed: int) -> None:
        self.cfg = cfg
        self.vocab = vocab
        self.max_len = pack_length
        self.gen = torch.Generator().manual_seed(seed)
        self.band = vocab // cfg.rules
        self.rules = [self._full_cycle_rule() for _ in range(cfg.rules)]

    def _randint(self, high: int) -> int:
        return int(torch.randint(high, (), generator=self.gen))

    def _full_cycle_rule(self) -> tuple[int, int]:
        """(a, b) such that x -> (a*x + b) mod band visits every token of the band (Hull-Dobell):
        b coprime with the band, a - 1 divisible by every prime factor of it (and by 4 if 4 is)."""
        m, step, n, p = self.band, 1, self.band, 2
        while n > 1:
            if n % p == 0:
                step *= p
                while n % p == 0:
                    n //= p
            p += 1
        if m % 4 == 0:
            step = math.lcm(step, 4)
        a = 1 + step * (1 + self._randint(max(1, (m - 2) // step)))
        while True:
            b = self._randint(m)
            if math.gcd(b, m) == 1:
                return a, b

    def _lengths(self, n: int) -> list[int]:
        c = self.cfg
        short = torch.rand(n, generator=self.gen) < c.short_share
        median = torch.where(short, float(c.short_median), float(c.long_median))
        lengths = median * torch.exp(c.sigma * torch.randn(n, generator=self.gen))
        return lengths.round().clamp(c.min_len, self.max_len).long().tolist()

    def _content(self, length: int) -> Document:
        """One document: rule k walks band k from a random start; rule k is source k."""
        k = self._randint(len(self.rules))
        a, b = self.rules[k]
        x, m = self._randint(self.band), self.band
        tokens = [x]
        for _ in range(length - 1):
            x = (a * x + b) % m
            tokens.append(x)
        return Document(torch.tensor(tokens, dtype=torch.long) + k * m, channel=k % len(CHANNELS))

    def __iter__(self) -> Iterator[Document]:
        while True:
            for length in self._lengths(256):
                yield self._content(length)


def step_documents(
    docs: Iterator[Document],
    micro_batches: int,
    packs_per_micro_batch: int,
    pack_length: int,
    max_docs_per_pack: int,
    align: int = 1,
) -> Iterator[list[list[Document]]]:
    """Group the stream into steps of micro-batches of documents.

    A micro-batch takes documents in stream order while first-fit-decreasing still places all of
    them in ``packs_per_micro_batch`` packs (the THD packer then reproduces that placement); the
    first document that does not fit opens the next micro-batch. This caps every step at the
    token budget packs_per_step * pack_length, whichever layout trains on it.
    """
    budget = packs_per_micro_batch * pack_length
    pending: Document | None = None
    while True:
        step = []
        for _ in range(micro_batches):
            group: list[Document] = []
            lengths: list[int] = []
            used = 0
            while True:
                doc = pending if pending is not None else next(docs)
                pending = None
                slot = round_up(len(doc), align)
                trial = [*lengths, len(doc)]
                # The token count is a cheap first test; first-fit-decreasing has the last word.
                if (
                    used + slot <= budget
                    and len(first_fit_decreasing(trial, pack_length, max_docs_per_pack, align)) <= packs_per_micro_batch
                ):
                    group.append(doc)
                    lengths = trial
                    used += slot
                else:
                    pending = doc
                    break
            step.append(group)
        yield step
