"""A run named on the command line (`--run`): its id, a unique prefix of its id, or its name.

What users have at hand is what the dashboard shows first, the run's name ("demo-thd"), or the
start of its id; `resolve` turns either into the id, through the read API, and says what to type
instead when it cannot: the runs a name or prefix matches, or the closest names and ids.
"""

from __future__ import annotations

import difflib
import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

LIST_LIMIT = 1000  # the read API's largest page


class RunNotFound(Exception):
    """No single run matches; the message says what would."""


# What a request that got no answer raises (a refused or dropped connection, a timeout): the
# caller says the server cannot be reached.
UNREACHABLE = (urllib.error.URLError, OSError, http.client.HTTPException)


@dataclass(frozen=True)
class Reader:
    """GET requests to a packscope server's read API, with the standard library alone (so that
    `packscope export` runs with the bare package)."""

    server: str
    token: str | None = None
    timeout_s: float = 30.0

    def open(self, path: str, **params: Any) -> http.client.HTTPResponse:
        """The answer to GET /api/v1`path`, to read (a 2xx), else urllib.error.HTTPError; a
        401 is a RunNotFound that says to pass the read token."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        request = urllib.request.Request(f"{self.server}/api/v1{path}{query}", headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as err:
            if err.code == 401:
                err.close()
                needs = f"{self.server} needs a read token; pass --token or set PACKSCOPE_READ_TOKEN"
                raise RunNotFound(needs) from None
            raise

    def get(self, path: str, **params: Any) -> tuple[int, Any]:
        """(status, parsed JSON answer of a 200, else None)."""
        try:
            with self.open(path, **params) as response:
                return response.status, (json.loads(response.read()) if response.status == 200 else None)
        except urllib.error.HTTPError as err:
            err.close()
            return err.code, None


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
