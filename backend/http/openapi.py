"""The OpenAPI document as this server really behaves: bearer auth only where a token is set, and
every error answer an operation can give."""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from packscope.backend.http.settings import Settings

ERROR = {"$ref": "#/components/schemas/Error"}
ERROR_SCHEMA = {
    "title": "Error",
    "type": "object",
    "properties": {"detail": {"type": "string", "title": "Detail"}},
    "required": ["detail"],
}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}
VALIDATION = {"$ref": "#/components/schemas/HTTPValidationError"}


def _error(description: str, schema: dict[str, Any] = ERROR, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        answer["headers"] = headers
    return answer


def _errors_of(path: str, method: str, writes: bool, token_needed: bool) -> dict[str, dict[str, Any]]:
    out = {
        "422": _error("A parameter or the body is not valid; `detail` names the field", VALIDATION),
        "503": _error("Busy (shed load) or the database is unavailable; retry after Retry-After", headers=RETRY_AFTER),
    }
    if token_needed:
        out["401"] = _error("Missing or wrong bearer token")
        out["429"] = _error(
            "Too many refused tokens from this client within a minute (PACKSCOPE_TOKEN_FAILURES_PER_MINUTE)",
            headers=RETRY_AFTER,
        )
    if "{run_id}" in path or path.endswith("/compare"):
        out["404"] = _error("The run (or the asked interval) is not stored")
    if writes:
        out["403"] = _error("A write from another origin (Origin / Sec-Fetch-Site), as a web page would send")
    if writes and method in ("post", "patch"):
        out["400"] = _error("The body says Content-Encoding: gzip but does not decompress")
        out["413"] = _error("The body is over PACKSCOPE_MAX_BODY_BYTES after decompression")
        out["415"] = _error("A Content-Type other than application/json, or a Content-Encoding other than gzip")
    if path.endswith("/runs") and method == "post":
        out["409"] = _error("The run is stored with a different model")
    if writes and ("{run_id}" in path or path.endswith("/runs")):
        out["410"] = _error("The run was deleted; POST /api/v1/runs?recreate=true creates it again")
    return out


def document(app: FastAPI, settings: Settings) -> dict[str, Any]:
    """app.openapi: generated once, then adjusted to the tokens of `settings`."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    components = doc.setdefault("components", {})
    components.setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    uses_bearer = False
    for path, operations in doc.get("paths", {}).items():
        for method, operation in operations.items():
            writes = method != "get"
            token = settings.ingest_token if writes else settings.read_token
            if token is None:
                operation.pop("security", None)
            uses_bearer = uses_bearer or token is not None
            for code, answer in _errors_of(path, method, writes, token is not None).items():
                operation.setdefault("responses", {}).setdefault(code, answer)
    if not uses_bearer:
        components.pop("securitySchemes", None)
    app.openapi_schema = doc
    return doc
