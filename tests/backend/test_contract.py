"""The OpenAPI document is what the server checks: run ids in paths, the FLOPs model's fields and
bounds, and the methods each path serves (405 and OPTIONS name them all)."""

import re

import pytest

from packscope.backend.api.schemas import RUN_ID_PATTERN
from packscope.core.model_fields import MAX_MODEL_SIZE
from tests.backend.conftest import MODEL, run_body

RUNS = "/api/v1/runs"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/runs/a%00b"),
        ("GET", "/api/v1/runs/a%00b/series"),
        ("GET", "/api/v1/runs/a%00b/ranks"),
        ("GET", "/api/v1/runs/a%00b/intervals.csv"),
        ("GET", "/api/v1/runs/a%00b/stream"),
        ("POST", "/api/v1/runs/a%00b/intervals"),
        ("PATCH", "/api/v1/runs/a%00b"),
        ("DELETE", "/api/v1/runs/a%00b"),
        ("GET", "/api/v1/runs/has%20space"),
        ("GET", f"/api/v1/runs/{'x' * 65}"),
    ],
)
def test_a_run_id_no_run_can_have_is_the_same_422_on_every_database(make_client, database_url, method, path):
    # The issue: runs/a%00b answered 422 on PostgreSQL (the driver refused the NUL) and 404 on SQLite.
    client = make_client(database_url)
    body = {"intervals": []} if method == "POST" else {"name": "x"} if method == "PATCH" else None
    answer = client.request(method, path, json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["path", "run_id"]


@pytest.mark.parametrize("run_id", [".", ".."])
def test_a_run_id_that_urls_resolve_away_is_refused_at_creation(make_client, database_url, run_id):
    """/api/v1/runs/.. is /api/v1 to a browser or curl: such a run's page, reads and DELETE could
    never be reached, so the id is refused (and the OpenAPI pattern says so)."""
    client = make_client(database_url)
    answer = client.post(RUNS, json=run_body(run_id))
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["body", "run_id"]
    assert client.get(RUNS).json()["total"] == 0
    pattern = client.get("/openapi.json").json()["components"]["schemas"]["RunCreate"]["properties"]["run_id"]
    assert re.fullmatch(pattern["pattern"], run_id) is None
    for fine in ("...", ".a", "a.", "a", "x" * 64):
        assert re.fullmatch(pattern["pattern"], fine), fine
        assert client.post(RUNS, json=run_body(fine)).status_code == 201, fine


def test_the_run_page_of_such_an_id_is_not_found(client):
    assert client.get("/runs/a%00b").status_code == 404


def test_openapi_declares_the_run_id_pattern_on_every_run_path(client):
    doc = client.get("/openapi.json").json()
    for path, operations in doc["paths"].items():
        if "{run_id}" not in path:
            continue
        for method, operation in operations.items():
            (run_id,) = [p for p in operation["parameters"] if p["name"] == "run_id"]
            assert run_id["schema"]["pattern"] == RUN_ID_PATTERN, (method, path)


def model_schema(client) -> dict:
    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    create = schemas["RunCreate"]["properties"]["model"]
    return schemas[create["$ref"].rsplit("/", 1)[1]] if "$ref" in create else create


def test_openapi_gives_the_model_fields_and_bounds_the_server_checks(client):
    # The issue: model.name was in the schema but refused; sizes had no bounds.
    schema = model_schema(client)
    assert "name" not in schema["properties"]
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"layers", "hidden", "heads", "ffn", "vocab"}
    hidden = schema["properties"]["hidden"]
    assert (hidden["minimum"], hidden["maximum"]) == (1, MAX_MODEL_SIZE)
    assert schema["properties"]["mtp_depth"]["minimum"] == 0
    kv_heads = schema["properties"]["kv_heads"]["anyOf"]
    assert {"type": "null"} in kv_heads and any(k.get("minimum") == 1 for k in kv_heads)


@pytest.mark.parametrize("field", ["moe_layers", "layer_kinds"])
def test_openapi_says_a_per_layer_list_has_one_entry_per_layer(client, field):
    """JSON Schema cannot tie a list's length to `layers`: it gives the bounds that follow from it
    (1 to MAX_MODEL_SIZE entries) and the rule in words, and the server refuses an empty list."""
    (listed,) = [s for s in model_schema(client)["properties"][field]["anyOf"] if s.get("type") == "array"]
    assert (listed["minItems"], listed["maxItems"]) == (1, MAX_MODEL_SIZE)
    assert "layers" in listed["description"]
    answer = client.post(RUNS, json=run_body(model={**MODEL, field: []}))
    assert answer.status_code == 422 and "0 entries for 4 layers" in answer.text


@pytest.mark.parametrize(
    ("change", "accepted"),
    [
        ({"hidden": MAX_MODEL_SIZE}, True),
        ({"hidden": MAX_MODEL_SIZE + 1}, False),
        ({"hidden": 0}, False),
        ({"mtp_depth": 0}, True),
        ({"kv_heads": None}, True),
        ({"kv_heads": 0}, False),
        ({"gated": 1}, False),
        ({"layers": 2, "moe_layers": [0, 1], "moe_topk": 2}, True),
        ({"layers": 2, "moe_layers": [0, 2]}, False),
        ({"layers": 2, "moe_layers": [True, False]}, False),
        ({"name": "llama"}, False),
        ({"hidden": 256.0}, True),  # JSON Schema's integer
        ({"hidden": 256.5}, False),
        ({"hidden": "256"}, False),
    ],
)
def test_the_model_is_checked_as_the_schema_says(client, change, accepted):
    answer = client.post(RUNS, json=run_body("m", model={**MODEL, **change}))
    assert (answer.status_code == 201) is accepted, answer.text
    if not accepted:
        assert answer.status_code == 422 and answer.json()["detail"][0]["loc"][:2] == ["body", "model"]


def test_options_and_405_name_every_method_of_the_path(client, run):
    # The issue: OPTIONS /api/v1/runs said Allow: POST (only the first router's route).
    options = client.options(RUNS)
    assert options.status_code == 204
    assert options.headers["allow"] == "GET, OPTIONS, POST"
    put = client.put(RUNS, json={})
    assert put.status_code == 405 and put.headers["allow"] == "GET, OPTIONS, POST"
    assert client.options("/api/v1/runs/run-1").headers["allow"] == "DELETE, GET, OPTIONS, PATCH"
    assert client.delete("/api/v1/catalogue").headers["allow"] == "GET, OPTIONS"


@pytest.mark.parametrize("field", ["status", "archived", "layout"])
def test_a_patch_field_that_cannot_be_null_is_not_nullable_in_the_schema(client, run, field):
    schema = client.get("/openapi.json").json()["components"]["schemas"]["RunPatch"]["properties"][field]
    assert "anyOf" not in schema and schema["type"] != "null", schema
    answer = client.patch(f"{RUNS}/run-1", json={field: None})
    assert answer.status_code == 422 and f"{field} cannot be null" in answer.text


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/json"])
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_a_write_to_a_path_that_serves_no_such_method_is_405_whatever_its_content_type(
    client, run, method, content_type
):
    headers = {"Content-Type": content_type} if content_type else {}
    for path in ("/api/v1/catalogue", f"{RUNS}/run-1/series"):
        answer = client.request(method, path, content=b"{}", headers=headers)
        assert answer.status_code == 405, (path, answer.text)
        assert answer.headers["allow"] == "GET, OPTIONS"
    assert client.request(method, "/api/v1/nothing-here", content=b"{}", headers=headers).status_code == 404


@pytest.mark.parametrize(
    ("query", "loc"),
    [
        ("/api/v1/compare?run_id=a%00b", ["query", "run_id", 0]),
        ("/api/v1/compare?run_id=run-1&run_id=..", ["query", "run_id", 1]),
        (f"{RUNS}?q=a%00b", ["query", "q"]),
        (f"{RUNS}?project=a%00b", ["query", "project"]),
        (f"{RUNS}?tag=a%00b", ["query", "tag"]),
    ],
)
def test_an_id_or_filter_no_run_can_match_is_the_same_422_on_every_database(make_client, database_url, query, loc):
    """A NUL byte was no match on SQLite (404 or an empty list) and the database's refusal on
    PostgreSQL: now the parameter's pattern (in the OpenAPI document too) refuses it on both."""
    client = make_client(database_url)
    assert client.post(RUNS, json=run_body()).status_code == 201
    answer = client.get(query)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == loc
