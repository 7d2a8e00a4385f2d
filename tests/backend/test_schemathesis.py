"""Property-based run over the OpenAPI document (schemathesis): on SQLite and PostgreSQL, with and
without tokens, no operation answers 5xx or violates its documented response schema."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

EXAMPLES_PER_OPERATION = 25  # the whole run takes about a minute per database on 2 cores
TOKENS = {"open": {}, "closed": {"ingest_token": "1ngest", "read_token": "r3ad"}}


@pytest.mark.slow
@pytest.mark.parametrize("tokens", list(TOKENS))
def test_no_operation_answers_5xx_or_breaks_its_schema(make_client, database_url, new_run, tokens):
    client = make_client(database_url, **TOKENS[tokens])
    headers = {"Authorization": "Bearer 1ngest"} if tokens == "closed" else {}
    client.post("/api/v1/runs", json=new_run(), headers=headers)  # something for path parameters to find
    schema = schemathesis.openapi.from_asgi("/openapi.json", client.app)
    checks = [not_a_server_error, response_schema_conformance]
    failures: list[str] = []
    fuzzed: set[str] = set()

    for operation in schema.get_all_operations():
        op = operation.ok()
        fuzzed.add(f"{op.method.upper()} {op.path}" + (" with a body" if op.body else ""))
        token = ("1ngest" if op.method.upper() != "GET" else "r3ad") if tokens == "closed" else None
        if op.path.endswith("/stream"):  # an endless response: only its opening is checked elsewhere
            continue
        try:
            check_operation(op, token, checks)
        except Exception as exc:  # noqa: BLE001 - collect every failing operation, not just the first
            failures.append(f"{op.method.upper()} {op.path}: {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)
    # The batch route reads its raw body; the document still describes it, so it is fuzzed too.
    assert "POST /api/v1/runs/{run_id}/intervals with a body" in fuzzed, sorted(fuzzed)


def check_operation(op, token: str | None, checks: list) -> None:
    """Hypothesis-generated cases of one operation, each called and validated."""

    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy())
    def run(case: schemathesis.Case) -> None:
        if token:
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
        if op.path.endswith("/intervals") and op.method.upper() == "POST":
            case.path_parameters = {"run_id": "run-1"}  # a stored run: fuzzed records that pass are stored
        case.call_and_validate(checks=checks)

    run()
