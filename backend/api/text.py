"""Strings and JSON values that every database can store and every response can carry.

PostgreSQL refuses NUL bytes in text, a lone surrogate (a JSON "\\ud800" escape) cannot be encoded
as UTF-8 by either driver, and JSON has no NaN or infinity: such input is refused as a 422 naming
the field, before anything is stored, instead of failing later inside the database or the response.
"""

import json
import math
from typing import Annotated, Any

from pydantic import AfterValidator

# A run's free-form `config`: deep enough for any real trainer config, shallow enough that no
# recursive encoder (pydantic, json, a JSON column) runs out of stack on it.
MAX_JSON_DEPTH = 64
MAX_CONFIG_BYTES = 256 * 1024


# A query parameter compared with text columns: no NUL, which PostgreSQL refuses in any text (a 422
# from the database there, no match on SQLite) and so refused before any query, on both alike.
NO_NUL_PATTERN = r"^[^\x00]*$"


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored as text, or None when it can."""
    if "\x00" in value:
        return "contains a NUL byte (\\u0000), which text columns cannot store"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains a lone surrogate ({value[exc.start]!r} at position {exc.start}), which is not valid UTF-8"
    return None


def safe_text(value: str) -> str:
    problem = text_problem(value)
    if problem:
        raise ValueError(f"the string {problem}")
    return value


SafeStr = Annotated[str, AfterValidator(safe_text)]


def _short(path: str) -> str:
    return path if len(path) <= 120 else path[:60] + "..." + path[-57:]


def _check_json(value: Any, depth: int, path: str) -> None:
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"nests deeper than {MAX_JSON_DEPTH} levels (at {_short(path)})")
    if isinstance(value, str):
        problem = text_problem(value)
        if problem:
            raise ValueError(f"the string at {_short(path)} {problem}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"holds {value} at {_short(path)}; JSON has no NaN or infinity")
    elif isinstance(value, dict):
        for key, item in value.items():
            problem = text_problem(key)
            if problem:
                raise ValueError(f"a key at {_short(path)} {problem}")
            _check_json(item, depth + 1, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, depth + 1, f"{path}[{i}]")


def storable_json(value: Any, max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """`value` unchanged when it is JSON every backend can store and return; a ValueError otherwise."""
    _check_json(value, 1, "$")
    size = len(json.dumps(value, ensure_ascii=False).encode())
    if size > max_bytes:
        raise ValueError(f"is {size} bytes as JSON; at most {max_bytes} are stored")
    return value
