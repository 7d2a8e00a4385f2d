"""Security headers, the sign-in form's limits, the cookie's contents and the OpenAPI document."""

import pytest

from packscope.backend.security import SIGN_IN_MAX_BYTES


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
