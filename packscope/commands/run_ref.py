"""A run named on the command line (`--run`): its id, a unique prefix of its id, or its name.

What users have at hand is what the dashboard shows first, the run's name ("demo-thd"), or the
start of its id; `resolve` turns either into the id, through the read API, and says what to type
instead when it cannot: the runs a name or prefix matches, or the closest names and ids.
"""

from __future__ import annotations

import difflib
import urllib.parse
from dataclasses import dataclass
from typing import Any

LIST_LIMIT = 1000  # the read API's largest page


class RunNotFound(Exception):
    """No single run matches; the message says what would."""


@dataclass(frozen=True)
class Reader:
    """GET requests to a packscope server's read API."""

    server: str
    token: str | None = None

    def get(self, path: str, **params: Any) -> tuple[int, Any]:
        import httpx

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        response = httpx.get(f"{self.server}/api/v1{path}", params=params, headers=headers, timeout=30.0)
        if response.status_code == 401:
            raise RunNotFound(f"{self.server} needs a read token; pass --token or set PACKSCOPE_READ_TOKEN")
        return response.status_code, (response.json() if response.status_code == 200 else None)


def _runs(reader: Reader, **params: Any) -> list[dict[str, Any]]:
    status, body = reader.get("/runs", archived="true", limit=LIST_LIMIT, **params)
    if status != 200:
        raise RunNotFound(f"{reader.server}/api/v1/runs answered HTTP {status}")
    return body["runs"]


def _described(run: dict[str, Any]) -> str:
    name = f" ({run['name']})" if run.get("name") and run["name"] != run["run_id"] else ""
    return f"{run['run_id']}{name}, started {str(run.get('started_at', '?'))[:19].replace('T', ' ')}"


def resolve(reader: Reader, text: str) -> str:
    """The id of the one run that `text` names: its id, a unique id prefix or a unique name."""
    status, _ = reader.get(f"/runs/{urllib.parse.quote(text, safe='')}")
    if status == 200:
        return text
    candidates = _runs(reader, q=text)  # name, id or tag contains the text
    by_prefix = [r for r in candidates if r["run_id"].startswith(text)]
    by_name = [r for r in candidates if r.get("name") == text]
    for found, how in ((by_name, "named"), (by_prefix, "whose id starts with")):
        if len(found) == 1:
            return found[0]["run_id"]
        if found:
            listed = "\n  ".join(_described(r) for r in found[:10])
            more = f"\n  ... and {len(found) - 10} more" if len(found) > 10 else ""
            raise RunNotFound(
                f"{len(found)} runs {how} {text!r} on {reader.server}:\n  {listed}{more}\npass one of their ids"
            )
    raise RunNotFound(_not_stored(reader, text))


def _not_stored(reader: Reader, text: str) -> str:
    runs = _runs(reader)
    words = {r["run_id"]: r for r in runs} | {r["name"]: r for r in runs if r.get("name")}
    close = difflib.get_close_matches(text, list(words), n=5, cutoff=0.5)
    message = f"no run is stored on {reader.server} with the id, id prefix or name {text!r}"
    if close:
        shown = dict.fromkeys(words[word]["run_id"] for word in close)
        listed = "\n  ".join(_described(next(r for r in runs if r["run_id"] == run_id)) for run_id in shown)
        return f"{message}; the closest:\n  {listed}"
    return f"{message}; {reader.server}/api/v1/runs lists the runs"
