"""Faults injected into the reference trainer on purpose (`packscope train --fault KIND:K=V,...`), so
that the server's alerts can be tested end to end against a real run.

A fault is a small frozen spec, parsed from one `--fault` text (``parse_fault``; a ValueError's
one line says what is wrong); ``FaultInjector`` applies the specs of a run at a few points of the
training loop. Without a fault the loop holds no injector at all: three ``is None`` tests per step.

Step numbers are the agent's and the dashboard's: the first step of a run is step 1.

No torch at import: `packscope train --help` parses without it (trainer/config.py imports this).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # config.py imports this module
    from packscope.trainer.config import DataConfig


@dataclass(frozen=True)
class Slowdown:
    """Every step from step ``start`` (until step ``until``, excluded) takes ``factor`` times as long:
    a sleep inside the step of (factor - 1) times the step's own work, so its timed span grows."""

    start: int
    factor: float
    until: int | None = None


@dataclass(frozen=True)
class Stall:
    """Before step ``at``, the training thread stops for ``seconds``: no step, no interval."""

    at: int
    seconds: float


@dataclass(frozen=True)
class SlowRank:
    """Rank ``rank``'s steps take ``factor`` times as long, from step ``start`` (until ``until``).

    ``apart`` (the default) keeps the other ranks' wait out of their timed steps with a barrier
    between steps, so each rank's step time shows its own work. ``apart=off`` leaves the barrier out,
    as a real data-parallel job has none: the others then wait inside their own steps (the gradient
    all-reduce) and every rank's step times the same (docs/ledger.md, "Stragglers")."""

    rank: int
    factor: float
    start: int = 1
    until: int | None = None
    apart: bool = True


@dataclass(frozen=True)
class AddedSyncs:
    """``count`` host synchronizations added to every step from ``start`` (until ``until``), each
    a read of the step's loss into Python at one code line of this module (``added_syncs``)."""

    start: int
    count: int
    until: int | None = None


@dataclass(frozen=True)
class NanLoss:
    """The loss of step ``at`` (and of the ``steps`` - 1 after it) reported as NaN."""

    at: int
    steps: int = 1


@dataclass(frozen=True)
class MixChange:
    """From step ``start`` (until ``until``), documents come from a second stream whose short share
    is ``short_share`` (default: 1 - the run's --data-short-share): another length mix."""

    start: int
    short_share: float | None = None
    until: int | None = None


@dataclass(frozen=True)
class Crash:
    """Step ``at`` raises InjectedCrash before it begins: the run ends failed, as on any exception."""

    at: int


class InjectedCrash(RuntimeError):
    """What the crash fault raises."""


def _switch(value: str) -> bool:
    if value in ("on", "1", "yes"):
        return True
    if value in ("off", "0", "no"):
        return False
    raise ValueError(value)


def _text(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


Fault = Slowdown | Stall | SlowRank | AddedSyncs | NanLoss | MixChange | Crash

# kind -> (spec, {key in the text: (field, type)}, keys required)
_KINDS: dict[str, tuple[type, dict[str, tuple[str, Callable[[str], Any]]], tuple[str, ...]]] = {
    "slowdown": (
        Slowdown,
        {"from": ("start", int), "factor": ("factor", float), "until": ("until", int)},
        ("from", "factor"),
    ),
    "stall": (Stall, {"at": ("at", int), "seconds": ("seconds", float)}, ("at", "seconds")),
    "slow-rank": (
        SlowRank,
        {
            "rank": ("rank", int),
            "factor": ("factor", float),
            "from": ("start", int),
            "until": ("until", int),
            "apart": ("apart", _switch),
        },
        ("rank", "factor"),
    ),
    "syncs": (
        AddedSyncs,
        {"from": ("start", int), "count": ("count", int), "until": ("until", int)},
        ("from", "count"),
    ),
    "nan-loss": (NanLoss, {"at": ("at", int), "steps": ("steps", int)}, ("at",)),
    "mix": (
        MixChange,
        {"from": ("start", int), "short_share": ("short_share", float), "until": ("until", int)},
        ("from",),
    ),
    "crash": (Crash, {"at": ("at", int)}, ("at",)),
}

FORMS = {
    "slowdown": "slowdown:from=N,factor=F[,until=M]",
    "stall": "stall:at=N,seconds=S",
    "slow-rank": "slow-rank:rank=R,factor=F[,from=N,until=M,apart=on|off]",
    "syncs": "syncs:from=N,count=K[,until=M]",
    "nan-loss": "nan-loss:at=N[,steps=K]",
    "mix": "mix:from=N[,short_share=X,until=M]",
    "crash": "crash:at=N",
}


def parse_fault(text: str) -> Fault:
    """The fault a `--fault` text names, e.g. ``slowdown:from=40,factor=1.5``."""
    kind, _, rest = text.partition(":")
    if kind not in _KINDS:
        raise ValueError(f"unknown fault {kind!r} in {text!r}; choose one of {', '.join(_KINDS)}")
    spec, keys, required = _KINDS[kind]
    values: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, equals, value = item.partition("=")
        if not equals or key not in keys:
            raise ValueError(f"{kind}: {item!r} is not one of {', '.join(f'{k}=' for k in keys)} (in {text!r})")
        field, kind_of = keys[key]
        try:
            values[field] = kind_of(value)
        except ValueError:
            what = "an integer" if kind_of is int else "a number" if kind_of is float else "on or off"
            raise ValueError(f"{kind}: {key} must be {what}, got {value!r}") from None
    missing = [k for k in required if keys[k][0] not in values]
    if missing:
        raise ValueError(f"{kind} needs {', '.join(f'{k}=' for k in missing)}: {FORMS[kind]}")
    fault = spec(**values)
    _check(kind, fault)
    return fault


def _check(kind: str, fault: Fault) -> None:
    for name in ("start", "at", "steps", "count"):
        value = getattr(fault, name, 1)
        if value < 1:
            raise ValueError(
                f"{kind}: {'from' if name == 'start' else name} must be >= 1 (steps count from 1), got {value}"
            )
    until = getattr(fault, "until", None)
    start = getattr(fault, "start", 1)
    if until is not None and until <= start:
        raise ValueError(f"{kind}: until ({until}) must be after from ({start})")
    factor = getattr(fault, "factor", None)
    if factor is not None and not (factor > 1 and math.isfinite(factor)):
        raise ValueError(f"{kind}: factor must be a finite number > 1, got {factor}")
    if isinstance(fault, Stall) and not (fault.seconds > 0 and math.isfinite(fault.seconds)):
        raise ValueError(f"stall: seconds must be > 0, got {fault.seconds}")
    if isinstance(fault, SlowRank) and fault.rank < 0:
        raise ValueError(f"slow-rank: rank must be >= 0, got {fault.rank}")
    if isinstance(fault, MixChange) and fault.short_share is not None and not 0 <= fault.short_share <= 1:
        raise ValueError(f"mix: short_share must be between 0 and 1, got {fault.short_share}")


def fault_text(fault: Fault) -> str:
    """The `--fault` text of a spec: parse_fault(fault_text(f)) == f."""
    kind = next(k for k, (spec, _, _) in _KINDS.items() if spec is type(fault))
    keys = _KINDS[kind][1]
    values = {key: getattr(fault, field) for key, (field, _) in keys.items()}
    parts = [f"{key}={_text(value)}" for key, value in values.items() if value is not None]
    return f"{kind}:{','.join(parts)}"


def active(fault: Slowdown | SlowRank | AddedSyncs | MixChange, step: int) -> bool:
    return step >= fault.start and (fault.until is None or step < fault.until)


def mix_data(fault: MixChange, data: DataConfig) -> DataConfig:
    """The second stream's documents: another short share, the rest as the run's."""
    share = fault.short_share if fault.short_share is not None else 1 - data.short_share
    return replace(data, short_share=share)


class DocumentSwitch:
    """An endless document iterator that reads one of two streams: the run's, or the mix fault's
    while ``second`` is set (the step grouping takes documents from it one at a time)."""

    def __init__(self, first: Iterator[Any], second: Iterator[Any]) -> None:
        self.streams = (first, second)
        self.second = False

    def __iter__(self) -> DocumentSwitch:
        return self

    def __next__(self) -> Any:
        return next(self.streams[self.second])


class FaultInjector:
    """The faults of one rank's run, applied at the loop's points:

    * ``before_step(step)``, before the step's batches are drawn: the stall, the crash, the mix switch, and
      (with a slow rank among several) the barrier that keeps the others' wait out of their steps;
    * ``step_began()``, right after the agent's step_begin: the clock a slowdown scales;
    * ``inside_step(step, loss)``, after the optimizer step, before the agent's step_end (inside
      the step's timed span): added syncs, a NaN loss, the sleep of a slowdown or a slow rank.
    """

    def __init__(
        self, faults: tuple[Fault, ...], rank: int, world_size: int, documents: DocumentSwitch | None = None
    ) -> None:
        self.faults = faults
        self.rank = rank
        self.world_size = world_size
        self.documents = documents
        self._began = 0.0

    def before_step(self, step: int) -> None:
        for fault in self.faults:
            if isinstance(fault, Stall) and step == fault.at:
                time.sleep(fault.seconds)
            elif isinstance(fault, Crash) and step == fault.at:
                raise InjectedCrash(f"--fault crash:at={fault.at}")
            elif isinstance(fault, MixChange) and self.documents is not None:
                self.documents.second = active(fault, step)
        if self.world_size > 1 and any(isinstance(f, SlowRank) and f.apart for f in self.faults):
            # In data parallelism every rank waits for the slowest inside its own step (the
            # gradient all-reduce), so every rank's step would time the same. Waiting here, between
            # steps, the others' timed steps hold their own work and the slow rank's shows longer.
            import torch.distributed as dist

            dist.barrier()

    def _slows(self, fault: Slowdown | SlowRank, step: int) -> bool:
        return active(fault, step) and (isinstance(fault, Slowdown) or fault.rank == self.rank)

    def step_began(self) -> None:
        self._began = time.perf_counter()

    def inside_step(self, step: int, loss: Any) -> None:
        """``loss``: the step's mean loss, a device tensor (read here only by the syncs fault)."""
        factor = 1.0
        for fault in self.faults:
            if isinstance(fault, AddedSyncs) and active(fault, step):
                added_syncs(loss, fault.count)
            elif isinstance(fault, NanLoss) and fault.at <= step < fault.at + fault.steps:
                loss.add_(math.nan)  # in place, on the device: no read, and the weights are untouched
            elif isinstance(fault, Slowdown | SlowRank) and self._slows(fault, step):
                factor *= fault.factor
        if factor > 1:
            time.sleep((factor - 1) * (time.perf_counter() - self._began))


def added_syncs(loss: Any, count: int) -> None:
    """The syncs fault's own code line, so that the sync-site table names it."""
    for _ in range(count):
        loss.item()


def injector_for(
    faults: tuple[Fault, ...], rank: int, world_size: int, documents: DocumentSwitch | None
) -> FaultInjector | None:
    """None without a fault: the loop then pays three `is None` tests per step."""
    return FaultInjector(faults, rank, world_size, documents) if faults else None


def mix_fault(faults: tuple[Fault, ...]) -> MixChange | None:
    mixes = [f for f in faults if isinstance(f, MixChange)]
    return mixes[0] if mixes else None
