"""Strict checks of a FLOPs model's fields, shared by ``ModelSpec`` and its parts.

A model dict arrives as JSON from agents of any version; Python would take ``true`` for 1 and a
dataclass would take ``"1024"`` for a size, and the FLOPs would be silently wrong. Every check
names the field and says what it must be.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

MAX_MODEL_SIZE = 2**24  # any layer count, width or vocabulary of a real model


def check_int(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_MODEL_SIZE:
        raise ValueError(f"model field {key!r} must be an integer from {minimum} to {MAX_MODEL_SIZE}, got {value!r}")
    return value


def check_optional_int(key: str, value: Any, minimum: int) -> int | None:
    return None if value is None else check_int(key, value, minimum)


def check_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"model field {key!r} must be true or false, got {value!r}")
    return value


def check_flags(key: str, value: Any, layers: int) -> tuple[int, ...]:
    """One 0/1 flag per layer (ints, not bools)."""
    flags = tuple(value) if isinstance(value, (list, tuple)) else None
    if flags is None or not all(isinstance(x, int) and not isinstance(x, bool) and x in (0, 1) for x in flags):
        raise ValueError(f"model field {key!r} must be null or a list of 0/1 flags, one per layer")
    if len(flags) != layers:
        raise ValueError(f"{key} has {len(flags)} entries for {layers} layers")
    return flags


def check_kinds(key: str, value: Any, layers: int, known: Sequence[str]) -> tuple[str, ...]:
    """One kind name per layer, each one of ``known``."""
    kinds = tuple(value) if isinstance(value, (list, tuple)) else None
    if kinds is None or not all(isinstance(x, str) for x in kinds):
        raise ValueError(f"model field {key!r} must be null or a list of layer kinds ({', '.join(known)})")
    unknown = sorted({k for k in kinds if k not in known})
    if unknown:
        raise ValueError(
            f"model field {key!r} holds unknown layer kind(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    if len(kinds) != layers:
        raise ValueError(f"{key} has {len(kinds)} entries for {layers} layers")
    return kinds


def dict_fields(
    what: str, cls: type[Any], data: Any, lists: Iterable[str], leave_out: Iterable[str] = ()
) -> dict[str, Any]:
    """The keyword arguments of dataclass `cls` from a JSON object, strictly: an object, no field
    `cls` lacks (nor one of `leave_out`), every field without a default there, and the `lists`
    (each null or a JSON list) as tuples. The dataclass checks the values themselves."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} is a JSON object, got {data!r}")
    fields = [f for f in dataclasses.fields(cls) if f.name not in set(leave_out)]
    refuse_unknown(what, data, (f.name for f in fields))
    missing = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in data
    ]
    if missing:
        raise ValueError(f"{what} lacks the field(s) {', '.join(missing)}")
    values = dict(data)
    for key in lists:
        value = values.get(key)
        if value is not None and not isinstance(value, (list, tuple)):
            raise ValueError(f"{what} field {key!r} must be null or a list, got {value!r}")
        if value is not None:
            values[key] = tuple(value)
    return values


def refuse_unknown(what: str, data: Mapping[str, Any], known: Iterable[str]) -> None:
    known_set = set(known)
    unknown = sorted(str(k) for k in set(data) - known_set)
    if unknown:
        raise ValueError(f"unknown {what} field(s) {', '.join(unknown)}; known: {', '.join(sorted(known_set))}")


class _Dataclass(Protocol):
    __dataclass_fields__: dict[str, Any]


T = TypeVar("T", bound=_Dataclass)


def nested_from_dict(cls: type[T], key: str, value: Any) -> T | None:
    """A nested part of a model (``mla``, ``linear_attention``) from its JSON object, or None."""
    if value is None or isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"model field {key!r} must be null or an object, got {value!r}")
    return cls(**dict_fields(f"model {key}", cls, value, ()))
