"""A packscope server's URL, checked where it is given (the agent's config, `packscope export`): a
URL without a scheme (``localhost:8000``) would otherwise be retried for ever as unreachable."""

from __future__ import annotations

import urllib.parse


def checked_server_url(url: str) -> str:
    """`url` without a trailing slash, or a ValueError saying what a server URL looks like."""
    example = "a URL like http://127.0.0.1:8000"
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https"):
        hint = f"; did you mean http://{url.strip()}?" if "://" not in url else ""
        raise ValueError(f"the packscope server must be {example} (http or https), got {url!r}{hint}")
    try:
        parsed.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ValueError(f"the packscope server must be {example}, got {url!r}: its port is not a number") from None
    if not parsed.hostname:
        raise ValueError(f"the packscope server must be {example}, got {url!r}: it names no host")
    if parsed.query or parsed.fragment:
        raise ValueError(f"the packscope server must be {example}, got {url!r}: drop the ?query or #fragment")
    return url.strip().rstrip("/")
