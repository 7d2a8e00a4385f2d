"""Dashboard pages: server-rendered HTML, the 404 page, the vendored plotly bundle, static modules."""

import json
import re

import pytest
from fastapi.testclient import TestClient
from wire_records import packed_interval

from packscope.backend.http.deps import READ_COOKIE
from packscope.backend.http.settings import Settings
from packscope.backend.server.app import create_app
from packscope.frontend import PLOTLY_JS, STATIC_DIR

MODEL = {"layers": 2, "hidden": 256, "heads": 4, "ffn": 1024, "vocab": 32000}


def run_body(run_id, name, **extra):
    return {
        "run_id": run_id,
        "name": name,
        "project": "demo",
        "model": MODEL,
        "layout": "thd",
        "hardware": {"gpu_name": "NVIDIA H200", "gpu_count": 1, "peak_tflops": 989.0},
        **extra,
    }


def interval(k):
    return packed_interval(k, pack=1024, docs_per_pack=4, doc_len=250, gpu_time_s=0.9, syncs_per_step=2, loss=3.0)


@pytest.fixture
def client(tmp_path):
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'pages.db'}"))
    with TestClient(app) as client:
        for run_id, name in [("run-a", "thd-demo"), ("run-b", "bshd-demo")]:
            assert client.post("/api/v1/runs", json=run_body(run_id, name)).status_code == 201
        answer = client.post("/api/v1/runs/run-a/intervals", json={"intervals": [interval(k) for k in range(3)]})
        assert answer.json() == {"accepted": 3, "duplicates": 0}
        yield client


def test_runs_page_loads_its_module(client):
    page = client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/static/runs.js">' in page.text
    assert 'id="runs-body"' in page.text


def test_run_page_renders_the_run(client):
    page = client.get("/runs/run-a")
    assert page.status_code == 200
    assert "<title>thd-demo · packscope</title>" in page.text
    assert 'data-run-id="run-a"' in page.text
    assert 'data-ranks="1"' in page.text  # run_early.js asks for the ranks of a run of several only
    assert "project demo" in page.text and "1 × NVIDIA H200" in page.text
    assert 'href="/api/v1/runs/run-a/intervals.csv"' in page.text
    # run_early.js takes the first answers and draws the headline chart before plotly.js runs:
    # the head preloads plotly.js last (fetched, not run); run_early.js runs it after the drawing.
    head = page.text[: page.text.index("</head>")]
    assert '<script type="module" src="/static/run_early.js"></script>' in head
    assert head.rstrip().endswith('<link rel="preload" as="script" href="/vendor/plotly.min.js">')
    assert page.text.count("/vendor/plotly.min.js") == 1  # no script of the page's own
    assert 'export const PLOTLY_JS = "/vendor/plotly.min.js";' in (STATIC_DIR / "run_early.js").read_text()
    # Every chart the page script draws into is in the markup.
    charts = (
        "tflops",
        "overcount",
        "mfu",
        "step_time",
        "tokens",
        "syncs",
        "histogram",
        "padding",
        "loss",
        "gpu_util",
        "gpu_power",
        "energy",
    )
    for chart in charts:
        assert f'id="chart-{chart}"' in page.text
    # Useful work is the headline; the system panel waits hidden for NVML readings.
    assert re.search(r'class="stat headline" data-stat="tflops_useful"', page.text)
    assert '<section class="system" id="system" hidden>' in page.text
    assert 'id="definitions"' in page.text


def static_imports(module, seen=None):
    """The static modules `module` (a file of STATIC_DIR) imports, directly or through others."""
    seen = set() if seen is None else seen
    for name in re.findall(r'^import [^;]*? from "\./([\w.]+\.js)";', (STATIC_DIR / module).read_text(), re.M):
        if name not in seen:
            seen.add(name)
            static_imports(name, seen)
    return seen


def test_run_page_preloads_every_module_run_early_js_imports(client):
    # The first answers are asked once run_early.js has run, which waits for all it imports: the
    # head asks for them beside it (modulepreload), not one level after another.
    page = client.get("/runs/run-a").text
    head = page[: page.index("</head>")]
    preloaded = set(re.findall(r'<link rel="modulepreload" href="/static/([\w.]+\.js)">', head))
    imported = static_imports("run_early.js")
    assert imported and preloaded == imported
    for name in preloaded:
        assert client.get(f"/static/{name}").status_code == 200


def test_run_page_preloads_the_answers_run_early_js_asks_first(client):
    # The head's preloads are only taken by requests for the very same URLs: they must be the
    # paths run_early.js asks first (api.js's paths, with run_sizes.js's number of points).
    head = client.get("/runs/run-a").text.split("</head>")[0]
    preloaded = re.findall(r'<link rel="preload" as="fetch" crossorigin href="([^"]+)">', head)
    points = re.search(r"^export const SERIES_POINTS = (\d+);", (STATIC_DIR / "run_sizes.js").read_text(), re.M)
    assert points
    series = f"/api/v1/runs/run-a/series?max_points={points[1]}"
    assert preloaded == ["/api/v1/catalogue", "/api/v1/runs/run-a", series]
    early = (STATIC_DIR / "run_early.js").read_text()
    series_path = "paths.series(runId, { max_points: SERIES_POINTS })"
    asked = f"const FIRST_PATHS = [paths.catalogue(), paths.run(runId), {series_path}]"
    assert asked in early
    for path in preloaded:
        assert client.get(path).status_code == 200


def test_run_page_shows_the_runs_configuration_flattened_and_escaped(client):
    config = {"lr": 0.0003, "data": {"pack_length": 4096, "rules": ["a", "b"]}, "note": "<b>x</b>", "empty": {}}
    client.post("/api/v1/runs", json=run_body("run-c", "cfg", config=config, parallel={"dp": 8}))
    page = client.get("/runs/run-c").text
    start = page.index('<details class="card" id="run-settings">')
    section = page[start : page.index("</details>", start)]  # not the alert history's, which comes first
    rows = dict(re.findall(r"<th scope=\"row\"><code>([^<]*)</code></th><td><code>([^<]*)</code></td>", section))
    assert rows["lr"] == "0.0003"
    assert rows["data.pack_length"] == "4096"
    assert rows["data.rules"] == "[&#34;a&#34;, &#34;b&#34;]"  # JSON, escaped
    assert rows["note"] == "&#34;&lt;b&gt;x&lt;/b&gt;&#34;"
    assert rows["empty"] == "{}"
    assert rows["layers"] == "2" and rows["vocab"] == "32000"  # the FLOPs model
    assert rows["dp"] == "8" and rows["tp"] == "1"  # parallelism, defaults filled
    assert rows["gpu_name"] == "&#34;NVIDIA H200&#34;"
    assert "<b>x</b>" not in page


def test_run_page_escapes_names(client):
    client.post("/api/v1/runs", json=run_body("run-x", "<script>alert(1)</script>"))
    page = client.get("/runs/run-x")
    assert "<script>alert(1)</script>" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text


def test_unknown_run_is_a_404_page(client):
    page = client.get("/runs/no-such-run")
    assert page.status_code == 404
    assert page.headers["content-type"].startswith("text/html")
    assert "Run not found" in page.text and "no-such-run" in page.text


def test_compare_page_carries_the_run_ids_in_order(client):
    page = client.get("/compare", params=[("run_id", "run-b"), ("run_id", "run-a")])
    assert page.status_code == 200
    assert "Compare 2 runs" in page.text
    attribute = re.search(r'data-run-ids="([^"]*)"', page.text).group(1)
    assert json.loads(attribute.replace("&#34;", '"')) == ["run-b", "run-a"]


def test_compare_page_without_runs_says_what_to_do(client):
    page = client.get("/compare")
    assert page.status_code == 200
    assert "Pick two or more runs" in page.text


def test_plotly_bundle_is_served_from_the_package(client):
    bundle = client.get("/vendor/plotly.min.js")
    assert bundle.status_code == 200
    assert "javascript" in bundle.headers["content-type"]
    assert "max-age=" in bundle.headers["cache-control"]
    # plotly.js's bundle of the pages' trace types, committed in the package (tests/test_vendored_plotly.py).
    assert bundle.content == PLOTLY_JS.read_bytes()


def test_plotly_bundle_answers_a_revalidation_with_its_etag_by_304(client):
    """Once its week of caching is over, a browser asks again with the ETag it holds; an
    unchanged bundle is not sent again (Chromium keeps its compiled code with the cached copy)."""
    first = client.get("/vendor/plotly.min.js")
    etag = first.headers["etag"]
    assert first.headers["last-modified"]
    for held in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        again = client.get("/vendor/plotly.min.js", headers={"If-None-Match": held})
        assert again.status_code == 304, held
        assert again.content == b""
        assert again.headers["etag"] == etag and again.headers["cache-control"] == first.headers["cache-control"]
    changed = client.get("/vendor/plotly.min.js", headers={"If-None-Match": '"another-bundle"'})
    assert changed.status_code == 200 and changed.content == first.content


def test_useful_tflops_is_the_runs_lists_headline_column(client):
    page = client.get("/")
    metrics = re.findall(r'<th class="([^"]*)" data-metric="(\w+)"', page.text)
    assert metrics[0] == ("num headline", "tflops_useful")
    # The default columns: useful work, the two counts it is read against, how far apart they are,
    # MFU, step time and syncs (what a 1600 px window shows; the chooser offers the rest).
    assert [name for _, name in metrics[:7]] == [
        "tflops_useful",
        "tflops_thd",
        "tflops_bshd",
        "overcount_pct",
        "mfu_useful",
        "step_time_s",
        "syncs_per_iter",
    ]


def test_every_metric_a_page_names_is_in_the_catalogue(client):
    catalogue = {m["name"]: m for m in client.get("/api/v1/catalogue").json()["metrics"]}
    named = set()
    for path in ("/", "/runs/run-a", "/compare?run_id=run-a&run_id=run-b"):
        named |= set(re.findall(r'data-(?:stat|metric)="(\w+)"', client.get(path).text))
    for script in ("run.js", "run_headline.js", "compare.js"):
        text = (STATIC_DIR / script).read_text()
        named |= set(re.findall(r'\bm\("(\w+)"\)', text)) | set(re.findall(r'name: "(\w+)"', text))
    assert {"tflops_useful", "real_tokens_per_gpu_s", "gpu_util_pct", "energy_per_token_j", "mfu_useful"} <= named
    assert named - set(catalogue) == set()
    # The pages format with these specifiers only (static/format.js implements exactly them).
    assert {m["format"] for m in catalogue.values()} <= {".4g", ".4s", ".1f", ".1%", ",d", ".3g", ".3s"}


def test_labels_and_colours_are_defined_once(client):
    """Labels come from the catalogue, colours from colors.js; no page repeats either."""
    catalogue = client.get("/api/v1/catalogue").json()["metrics"]
    flops_labels = [m["label"] for m in catalogue if m["name"].startswith("tflops_")]
    colours = set(re.findall(r'"(#[0-9a-f]{6})"', (STATIC_DIR / "colors.js").read_text()))
    assert len(colours) >= 8
    templates = STATIC_DIR.parent / "templates"
    for path in [*templates.glob("*.html"), *STATIC_DIR.glob("*.js"), STATIC_DIR / "app.css"]:
        text = path.read_text()
        for label in flops_labels:
            assert label not in text, f"{path.name} spells the label {label!r}: take it from the catalogue"
        if path.suffix == ".js" and path.name != "colors.js":
            assert not colours & set(re.findall(r"#[0-9a-f]{6}", text)), f"{path.name} repeats a colour of colors.js"
    # The stylesheet reads the metric colours that colors.js sets; it declares none of them.
    css = (STATIC_DIR / "app.css").read_text()
    names = re.findall(r"^  (\w+): \"#", (STATIC_DIR / "colors.js").read_text(), re.M)
    assert {"thd", "baseline", "useful"} <= set(names)
    for name in names:
        assert not re.search(rf"--{name}\s*:", css), f"app.css declares --{name}; colors.js sets it"
    assert ".swatch.useful { background: var(--useful); }" in css
    # MFU and every other derived number come from the server, never from the peak in the browser.
    for script in STATIC_DIR.glob("*.js"):
        assert "peak_tflops" not in script.read_text() or script.name == "run.js"
    assert "/ state.peak" not in (STATIC_DIR / "run.js").read_text()


def test_static_modules_and_their_imports_resolve(client):
    assets = [*sorted(STATIC_DIR.glob("*.js")), STATIC_DIR / "app.css"]
    for asset in assets:
        served = client.get(f"/static/{asset.name}")
        assert served.status_code == 200, asset.name
        # A typo in a relative import only shows in a browser; catch it here.
        for target in re.findall(r'from "\./([\w.-]+)"', served.text):
            assert (STATIC_DIR / target).is_file(), f"{asset.name} imports missing {target}"


@pytest.fixture
def closed(tmp_path):
    """A server whose reads need PACKSCOPE_READ_TOKEN, with one run stored."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'closed.db'}", read_token="r3ad", ingest_token="1ngest")
    with TestClient(create_app(settings)) as client:
        write = {"Authorization": "Bearer 1ngest"}
        assert client.post("/api/v1/runs", json=run_body("run-a", "secret-run"), headers=write).status_code == 201
        yield client


def test_closed_dashboard_asks_for_the_token_and_leaks_nothing(closed):
    for path in ("/", "/runs/run-a", "/compare?run_id=run-a"):
        page = closed.get(path)
        assert page.status_code == 401 and 'action="/sign-in"' in page.text
        assert "secret-run" not in page.text
    assert closed.get("/api/v1/runs").status_code == 401
    assert closed.get("/vendor/plotly.min.js").status_code == 200  # the bundle is public


def test_wrong_token_is_refused_with_a_message(closed):
    answer = closed.post("/sign-in", data={"token": "nope", "next": "/"}, follow_redirects=False)
    assert answer.status_code == 401 and "does not match" in answer.text
    assert READ_COOKIE not in answer.headers.get("set-cookie", "")


def test_sign_in_sets_a_cookie_that_opens_pages_api_and_stream(closed):
    answer = closed.post("/sign-in", data={"token": "r3ad", "next": "/runs/run-a"}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/runs/run-a"
    cookie = answer.headers["set-cookie"]
    assert f"{READ_COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "secret-run" in closed.get("/runs/run-a").text  # the client keeps the cookie
    assert closed.get("/api/v1/runs").json()["runs"][0]["name"] == "secret-run"
    # Bearer tokens keep working for scripts.
    closed.cookies.clear()
    assert closed.get("/api/v1/runs", headers={"Authorization": "Bearer r3ad"}).status_code == 200


def test_sign_in_never_redirects_off_site(closed):
    answer = closed.post("/sign-in", data={"token": "r3ad", "next": "//evil.example/"}, follow_redirects=False)
    assert answer.headers["location"] == "/"


def test_the_run_page_is_rendered_with_the_layout_its_batches_had(client):
    assert client.patch("/api/v1/runs/run-a", json={"layout": "bshd"}).status_code == 200
    text = re.sub(r"\s+", " ", client.get("/runs/run-a").text)
    assert '<span id="run-layout">layout bshd (as its batches were; declared thd)</span>' in text
    text = re.sub(r"\s+", " ", client.get("/runs/run-b").text)
    assert '<span id="run-layout">layout thd</span>' in text  # as declared: nothing said twice


def test_the_runs_filters_offer_every_status_and_layout_the_server_shows(client):
    page = client.get("/").text
    status = re.search(r'<select id="filter-status".*?</select>', page, re.S).group(0)
    layout = re.search(r'<select id="filter-layout".*?</select>', page, re.S).group(0)
    assert re.findall(r"<option>(\w[\w-]*)</option>", status) == ["running", "stale", "crashed", "finished", "failed"]
    assert re.findall(r"<option>(\w[\w-]*)</option>", layout) == ["thd", "thd-static", "bshd", "mixed"]
    # Each is a value the API filters by.
    for value in ("stale", "crashed"):
        assert client.get("/api/v1/runs", params={"status": value}).status_code == 200
    for value in ("thd-static", "mixed"):
        assert client.get("/api/v1/runs", params={"layout": value}).status_code == 200
