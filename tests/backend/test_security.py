"""Security headers, the sign-in form's limits, the cookie's contents and the OpenAPI document."""

import argparse
import gzip
import json
import logging
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import ValidationError

from packscope.backend.http.security import SIGN_IN_MAX_BYTES
from packscope.backend.http.settings import Settings
from packscope.commands.serve import add_serve_arguments, serve_from_args
from tests.backend.conftest import run_body
from tests.backend.uvicorn_server import serving

ROOT = Path(__file__).resolve().parents[2]


def test_every_answer_carries_the_security_headers(client):
    for path in ("/", "/api/v1/runs", "/static/app.css", "/vendor/plotly.min.js", "/api/v1/runs/nope"):
        headers = client.get(path).headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"
        assert headers["referrer-policy"] == "no-referrer"


def test_pages_load_scripts_from_this_server_only(client):
    page = client.get("/").text
    assert "http://" not in page.split("<body")[0] and "https://" not in page.split("<body")[0]


@pytest.fixture
def closed(make_client):
    return make_client(read_token="r3ad", ingest_token="1ngest", sign_in_per_minute=3)


def test_the_cookie_holds_a_derived_value_not_the_token(closed):
    answer = closed.post("/sign-in", data={"token": "r3ad", "next": "/"}, follow_redirects=False)
    assert answer.status_code == 303
    cookie = answer.headers["set-cookie"]
    assert "r3ad" not in cookie and "HttpOnly" in cookie
    assert closed.get("/api/v1/runs").status_code == 200  # the cookie opens reads
    closed.cookies.clear()
    closed.cookies.set("packscope_read", "r3ad")  # the raw token as a cookie does not
    assert closed.get("/api/v1/runs").status_code == 401


def test_sign_in_guesses_are_throttled_per_client(closed):
    answers = [closed.post("/sign-in", data={"token": f"guess-{i}"}) for i in range(4)]
    assert [a.status_code for a in answers] == [401, 401, 401, 429]
    assert 1 <= int(answers[-1].headers["retry-after"]) <= 60


def test_a_huge_sign_in_form_is_refused_before_it_is_parsed(closed):
    answer = closed.post("/sign-in", data={"token": "x" * (SIGN_IN_MAX_BYTES + 1)})
    assert answer.status_code == 413

    def chunked():  # no Content-Length: counted while it arrives
        yield b"token="
        for _ in range(100):
            yield b"x" * 1024

    answer = closed.post("/sign-in", content=chunked(), headers={"content-type": "application/x-www-form-urlencoded"})
    assert answer.status_code == 413


def test_openapi_declares_bearer_auth_only_where_a_token_is_set(make_client):
    open_doc = make_client().get("/openapi.json").json()
    assert "securitySchemes" not in open_doc.get("components", {})
    assert not any("security" in op for ops in open_doc["paths"].values() for op in ops.values())

    doc = make_client(ingest_token="1ngest").get("/openapi.json").json()
    assert "securitySchemes" in doc["components"]
    assert (
        "security" in doc["paths"]["/api/v1/runs"]["post"]
        and "401" in doc["paths"]["/api/v1/runs"]["post"]["responses"]
    )
    assert "security" not in doc["paths"]["/api/v1/runs"]["get"]


def test_openapi_documents_the_error_answers(client):
    doc = client.get("/openapi.json").json()
    post = doc["paths"]["/api/v1/runs/{run_id}/intervals"]["post"]["responses"]
    assert {"404", "413", "415", "422", "503"} <= set(post)
    assert "Retry-After" in post["503"]["headers"]
    assert {"404", "422", "503"} <= set(doc["paths"]["/api/v1/runs/{run_id}/series"]["get"]["responses"])


# -- writes: JSON only, from this server's pages or from clients that are no browser ------------------
BATCH = "/api/v1/runs/run-1/intervals"


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]
)
def test_a_write_that_is_not_json_is_refused_and_stores_nothing(client, run, records, content_type):
    # A no-cors fetch from any web page can send these three without a preflight (the 5 records).
    body = json.dumps({"intervals": records(5)}).encode()
    headers = {} if content_type is None else {"content-type": content_type}
    answer = client.post(BATCH, content=body, headers=headers)
    assert answer.status_code == 415, answer.text
    assert "application/json" in answer.json()["detail"]
    assert client.get("/api/v1/runs/run-1").json()["records"] == 0
    assert client.patch("/api/v1/runs/run-1", content=b'{"name": "x"}', headers=headers).status_code == 415
    assert client.get("/api/v1/runs/run-1").json()["name"] == "demo"


def test_json_and_gzip_json_writes_are_taken(client, run, records):
    assert client.post(BATCH, json={"intervals": records(2)}).status_code == 200
    gz = gzip.compress(json.dumps({"intervals": records(2, start=2)}).encode())
    headers = {"content-type": "application/json; charset=utf-8", "content-encoding": "gzip"}
    assert client.post(BATCH, content=gz, headers=headers).json() == {"accepted": 2, "duplicates": 0}


@pytest.mark.parametrize(
    "headers",
    [
        {"origin": "http://evil.example"},
        {"origin": "null"},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site", "origin": "http://sibling.testserver"},
    ],
)
def test_cross_origin_writes_are_refused(client, run, records, headers):
    for method, path, body in (
        ("POST", BATCH, {"intervals": records(1)}),
        ("PATCH", "/api/v1/runs/run-1", {"name": "x"}),
        ("DELETE", "/api/v1/runs/run-1", None),
        ("POST", "/api/v1/runs", run_body("run-2")),
    ):
        answer = client.request(method, path, json=body, headers=headers)
        assert answer.status_code == 403, (method, path, answer.text)
        assert "PACKSCOPE_ALLOWED_ORIGINS" in answer.json()["detail"]
    assert client.get("/api/v1/runs").json()["total"] == 1
    assert client.get("/api/v1/runs/run-1").json()["records"] == 0


def test_writes_from_this_servers_pages_and_named_origins_are_taken(make_client):
    client = make_client(allowed_origins="https://dash.example.org")
    same = {"origin": "http://testserver", "sec-fetch-site": "same-origin"}
    assert client.post("/api/v1/runs", json=run_body(), headers=same).status_code == 201
    form_post = {"origin": "null", "sec-fetch-site": "same-origin"}  # a form under Referrer-Policy: no-referrer
    assert client.patch("/api/v1/runs/run-1", json={"name": "y"}, headers=form_post).status_code == 200
    older_browser = {"origin": "http://testserver"}  # no Sec-Fetch-Site: the Origin is judged
    assert client.patch("/api/v1/runs/run-1", json={"name": "z"}, headers=older_browser).status_code == 200
    named = {"origin": "https://dash.example.org", "sec-fetch-site": "cross-site"}
    assert client.patch("/api/v1/runs/run-1", json={"name": "x"}, headers=named).status_code == 200
    assert client.delete("/api/v1/runs/run-1", headers=same).status_code == 204


# -- a server whose writes are open says so; closed reads never leave writes open -------------------
def test_a_server_with_open_writes_says_so_in_the_log_and_on_every_page(make_client, caplog):
    with caplog.at_level(logging.WARNING, logger="packscope.backend"):
        open_client = make_client()
    assert any("PACKSCOPE_INGEST_TOKEN is not set" in r.getMessage() for r in caplog.records)
    for path in ("/", "/compare", "/runs/nope"):
        assert "Writes are open" in open_client.get(path).text, path
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="packscope.backend"):
        closed_client = make_client(ingest_token="1ngest")
    assert not any("PACKSCOPE_INGEST_TOKEN" in r.getMessage() for r in caplog.records)
    assert "Writes are open" not in closed_client.get("/").text


def test_a_read_token_without_an_ingest_token_refuses_to_start(sqlite_url, monkeypatch, capsys):
    with pytest.raises(ValidationError, match="PACKSCOPE_INGEST_TOKEN"):
        Settings(database_url=sqlite_url, read_token="r3ad", ingest_token=None)
    monkeypatch.setenv("PACKSCOPE_READ_TOKEN", "r3ad")
    monkeypatch.delenv("PACKSCOPE_INGEST_TOKEN", raising=False)
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert serve_from_args(parser.parse_args(["--database-url", sqlite_url, "--port", "1"])) == 2
    assert "set PACKSCOPE_INGEST_TOKEN too" in capsys.readouterr().err


def test_with_both_tokens_deletes_and_patches_need_the_ingest_token(closed):
    write = {"Authorization": "Bearer 1ngest"}
    assert closed.post("/api/v1/runs", json=run_body(), headers=write).status_code == 201
    read = {"Authorization": "Bearer r3ad"}
    assert closed.delete("/api/v1/runs/run-1").status_code == 401
    assert closed.delete("/api/v1/runs/run-1", headers=read).status_code == 401
    assert closed.patch("/api/v1/runs/run-1", json={"name": "x"}, headers=read).status_code == 401
    assert closed.delete("/api/v1/runs/run-1", headers=write).status_code == 204


def test_compose_binds_loopback_and_needs_tokens():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    backend = compose["services"]["backend"]
    assert all(str(port).startswith("127.0.0.1:") for port in backend["ports"]), backend["ports"]
    for variable in ("PACKSCOPE_INGEST_TOKEN", "PACKSCOPE_READ_TOKEN"):
        assert backend["environment"][variable].startswith(f"${{{variable}:?"), variable  # compose refuses when unset


# -- token guesses -----------------------------------------------------------------------------------
def test_api_token_guesses_are_throttled_per_client(make_client):
    client = make_client(ingest_token="1ngest", read_token="r3ad", token_failures_per_minute=5)
    answers = [client.get("/api/v1/runs", headers={"Authorization": f"Bearer guess-{i}"}) for i in range(7)]
    assert [a.status_code for a in answers] == [401] * 5 + [429] * 2
    assert 1 <= int(answers[-1].headers["retry-after"]) <= 60
    # Now even the right token waits out the minute: a guesser cannot tell it found the token.
    assert client.get("/api/v1/runs", headers={"Authorization": "Bearer r3ad"}).status_code == 429


def test_a_token_the_address_used_before_keeps_working_through_a_lock_out(make_client, new_run):
    """An agent and a guesser behind one address (a NAT): 20 wrong tokens lock out the guesses,
    not the agent's right token, nor the signed-in page's cookie. A right token this address never
    presented before the lock-out is still refused like any guess (no oracle for the guesser)."""
    client = make_client(ingest_token="1ngest", read_token="r3ad", token_failures_per_minute=20)
    agent = {"Authorization": "Bearer 1ngest"}
    assert client.post("/api/v1/runs", json=new_run(), headers=agent).status_code == 201
    assert client.post("/sign-in", data={"token": "r3ad"}, follow_redirects=False).status_code == 303
    cookie = dict(client.cookies)
    client.cookies.clear()
    assert client.get("/api/v1/runs", cookies=cookie).status_code == 200
    guesses = [client.get("/api/v1/runs", headers={"Authorization": f"Bearer guess-{i}"}) for i in range(22)]
    assert [a.status_code for a in guesses] == [401] * 20 + [429] * 2

    assert client.post("/api/v1/runs/run-1/heartbeat", json={}, headers=agent).status_code == 204
    assert client.get("/api/v1/runs", cookies=cookie).status_code == 200
    assert client.get("/api/v1/runs", headers={"Authorization": "Bearer guess-99"}).status_code == 429
    assert client.get("/api/v1/runs", headers={"Authorization": "Bearer r3ad"}).status_code == 429  # never proved
    assert client.get("/api/v1/runs").status_code == 429


def test_requests_without_a_token_are_no_guesses(make_client):
    client = make_client(ingest_token="1ngest", read_token="r3ad", token_failures_per_minute=2)
    assert [client.get("/api/v1/runs").status_code for _ in range(5)] == [401] * 5
    assert client.get("/api/v1/runs", headers={"Authorization": "Bearer r3ad"}).status_code == 200


def test_x_forwarded_for_is_believed_only_from_named_proxies(sqlite_url):
    # The issue: a new X-Forwarded-For per request from a local client escaped the sign-in throttle.
    settings = Settings(database_url=sqlite_url, ingest_token="1ngest", read_token="r3ad", sign_in_per_minute=3)
    with serving(settings) as url:
        codes = [
            httpx.post(
                f"{url}/sign-in", data={"token": "guess"}, headers={"X-Forwarded-For": f"10.0.0.{i}"}
            ).status_code
            for i in range(5)
        ]
    assert codes == [401, 401, 401, 429, 429]
    trusting = settings.model_copy(update={"trusted_proxies": "127.0.0.1"})
    with serving(trusting) as url:
        codes = [
            httpx.post(
                f"{url}/sign-in", data={"token": "guess"}, headers={"X-Forwarded-For": f"10.0.0.{i}"}
            ).status_code
            for i in range(5)
        ]
    assert codes == [401] * 5  # five clients behind a proxy this server was told to trust
