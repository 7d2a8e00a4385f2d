"""The Retry-After header of a refused request, in seconds: what the agent's sender and
`packscope import` wait before trying again (the server sends it with 429 and 503)."""

from __future__ import annotations

import email.utils
import time
from typing import Any


def retry_after_s(headers: Any) -> float | None:
    """Retry-After in seconds (it may also be an HTTP date); None when absent or unreadable."""
    value = headers.get("Retry-After") if headers is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
