"""How long the dashboard takes in Debian's chromium, from navigation to the first thing drawn:

* the runs page with 200 runs: until the table's first page of rows is shown;
* the run page of one long run (default 1,000,000 intervals, with per-channel losses and length
  histograms): until the first chart is drawn (`first_chart`: the headline chart's still SVG
  drawn before plotly.js runs, or any plotly chart), until plotly has drawn a chart (the first
  interactive one: `first_plotly_chart`), and until every series chart, the per-channel loss
  chart and the length heatmap are (`all_charts`); beside them, when the headline's series answer
  had arrived (`series_answered`) and how long after it plotly's first chart came; and where
  the time went (`breakdown`): the HTML, each first answer and plotly.js asked and answered, the
  still drawn, plotly.js asked and run (its own time in the page, `plotly_own_ms`) and the
  headline's plotly chart drawn, from the page's resource timings and performance marks.

The database is filled in-process through backend.ingest.ingest_batch (batches of 1000 validated
records, as bench/backend_scale.py's fill_run), then served by uvicorn on 127.0.0.1. Times are
read in the page (performance.now(), milliseconds since navigation began), checked each animation
frame; each page is loaded `--repeat` times in tabs of one browser context: the first load is
cold (nothing cached), the median of the others is warm (plotly.js in the HTTP cache; compiled
anew on every load in Playwright's off-the-record contexts, taken from V8's code cache from the
third load on with `--profile`, as in a person's browser); the run page again with plotly's full
bundle in place of the partial one (routed: fetched anew on every load). Beside them, the floor:
plotly.js's own time on a page that runs nothing else (from the script's insertion until it has
run, as the run page's `plotly_own_ms`), the partial bundle the server serves (frontend/vendor/)
and plotly's full bundle (from the plotly wheel). Prints one JSON object, with the load average
at the start and at the end.

    python bench/browser_timing.py                      # 1,000,000 intervals: minutes to fill
    python bench/browser_timing.py --intervals 20000    # a quick try
    python bench/browser_timing.py --keep /tmp/long.db  # filled once, reused by later runs

`--before DIR` (DIR: an earlier commit's frontend/ folder, `git archive REV frontend | tar -x -C
TMP`, DIR = TMP/frontend) measures the run page side by side: a second server, this checkout's
backend with DIR's templates, static modules and plotly bundle, on the same database; `--rounds`
rounds, each a fresh browser context per frontend (a cold load, then warm ones), the two
alternating (before first in odd rounds). `--only-run-page` leaves out the runs page and the full
bundle's run page (the plotly.js floor stays).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import backend_scale
import bench_data
import httpx
import plotly
from playwright import sync_api

from packscope.backend.store.db import make_engine, make_sessionmaker, upgrade_schema
from packscope.core.ports import free_port
from packscope.frontend import PLOTLY_JS

# plotly.js whole, as the plotly wheel ships it ([dev]): what the pages loaded before the partial bundle.
FULL_PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
MODEL = {"layers": 24, "hidden": 2048, "heads": 16, "kv_heads": 4, "head_dim": 128, "ffn": 5504, "vocab": 32000}
CHANNELS = ("code", "math", "web", "books")
# The page's readiness conditions: plotly has drawn a plot once it holds its full data; the run
# page's first drawing (static/sketch.js, before plotly.js runs) once its svg shows a line.
RUNS_SHOWN = "document.querySelectorAll('#runs-body tr[data-run-id]').length > 0"
DRAWN = "(p => p !== null && p._fullData?.length > 0 && p.querySelector('.main-svg') !== null)"
SKETCHED = (
    "(p => !p.closest('.chart').classList.contains('is-empty')"
    " && p.querySelector(':scope > svg.sketch path.line') !== null)"
)
# Any still (the ranks panel's too): sketch.js's lines or heatmap_sketch.js's cells (a canvas).
STILL = (
    "(p => p !== null && !p.closest('.chart').classList.contains('is-empty')"
    " && p.querySelector(':scope > svg.sketch :is(path.line, canvas.cells)') !== null)"
)
PLOTS = "[...document.querySelectorAll('.chart .plot')]"
FIRST_CHART = f"{PLOTS}.some(p => {SKETCHED}(p) || {DRAWN}(p))"
FIRST_PLOTLY_CHART = f"{PLOTS}.some({DRAWN})"
SERIES_CHARTS = ("tflops", "step_time", "tokens", "loss", "channels", "length_heatmap")
ALL_CHARTS = " && ".join(f"{DRAWN}(document.querySelector('#chart-{c} .plot'))" for c in SERIES_CHARTS)
# Read once the conditions held: when the run page's series answer (the headline's data) had
# arrived, ms from navigation; the first plotly chart's lag behind it is reported beside it.
SERIES_ANSWERED = "performance.getEntriesByType('resource').find(r => r.name.includes('/series?')).responseEnd"
# Where the run page's time went, read once its conditions held (ms from navigation, null where
# absent): the HTML, each first answer and plotly.js asked (startTime) and answered (responseEnd,
# from the HTTP cache on warm loads), and the page's own marks: the still drawing done, plotly.js
# asked and run (its script's load event), the headline's plotly chart drawn (run_early.js,
# first_chart.js, run.js).
RESOURCES = {
    "run_early_js": "u.pathname === '/static/run_early.js'",
    "run_js": "u.pathname === '/static/run.js'",
    "catalogue": "u.pathname === '/api/v1/catalogue'",
    "run": "/^\\/api\\/v1\\/runs\\/[^/]+$/.test(u.pathname)",
    "series": "u.pathname.endsWith('/series')",
    "heatmap": "u.pathname.endsWith('/histograms/over-time')",
    "plotly_js": "u.pathname === '/vendor/plotly.min.js'",
}
MARKS = ("still-drawn", "plotly-asked", "plotly-ran", "headline-plotted")
BREAKDOWN = (
    "(() => { const out = {}; const nav = performance.getEntriesByType('navigation')[0];"
    " out.html_answered = nav.responseEnd; out.dom_content_loaded = nav.domContentLoadedEventEnd;"
    " const entries = performance.getEntriesByType('resource');"
    + "".join(
        f" {{ const r = entries.find(e => {{ const u = new URL(e.name); return {match}; }});"
        f" out.{name}_asked = r ? r.startTime : null; out.{name}_answered = r ? r.responseEnd : null;"
        f" out.{name}_bytes = r ? r.encodedBodySize : null; }}"
        for name, match in RESOURCES.items()
    )
    + "".join(
        f" out['{m.replace('-', '_')}'] = performance.getEntriesByName('{m}', 'mark')[0]?.startTime ?? null;"
        for m in MARKS
    )
    + " return out; })()"
)


def run_body(run_id: str, **extra: Any) -> dict[str, Any]:
    hardware = {"gpu_name": "NVIDIA H200", "gpu_count": 8, "peak_tflops": 989.0}
    return {"run_id": run_id, "model": MODEL, "layout": "thd", "hardware": hardware, **extra}


def record(interval: int, rng: random.Random) -> dict[str, Any]:
    """bench_data's plausible record, on 8 GPUs, 5 s apart, with channel losses (and their tokens)."""
    r = bench_data.record(interval, 0, rng)
    r["gpus"] = 8
    r["wall_start"] = 1.7e9 + 5.0 * interval
    r["wall_end"] = r["wall_start"] + r["gpu_time_s"]
    shares = [rng.random() for _ in CHANNELS]
    r["channel_loss"] = {c: rng.uniform(1.5, 3.5) for c in CHANNELS}
    r["channel_tokens"] = {c: int(r["real_tokens"] * x / sum(shares)) for c, x in zip(CHANNELS, shares, strict=True)}
    return r


def fill_run(make_session: Any, http: httpx.Client, run_id: str, intervals: int) -> float:
    """The long run: 64 distinct records (with channels) re-numbered, stored in-process; seconds taken."""
    assert http.post("/api/v1/runs", json=run_body(run_id, name="long run")).status_code == 201
    rng = random.Random(run_id)
    template = [record(i, rng) for i in range(64)]
    return backend_scale.store_renumbered(make_session, run_id, template, intervals)


def fill_runs(make_session: Any, http: httpx.Client, args: argparse.Namespace) -> float:
    """Short runs, one interval each, so the runs table has numbers; then the long run (seconds)."""
    for i in range(args.runs - 1):
        assert http.post("/api/v1/runs", json=run_body(f"run-{i:03d}", project=f"p{i % 5}")).status_code == 201
        body = {"intervals": [record(0, random.Random(i))]}
        assert http.post(f"/api/v1/runs/run-{i:03d}/intervals", json=body).status_code == 200
    return fill_run(make_session, http, "long", args.intervals)


# A server whose pages come from another frontend/ folder (argv[1]): packscope.frontend's paths
# are set before the backend imports them.
OTHER_FRONTEND = """
import sys
from pathlib import Path
import uvicorn
import packscope.frontend as f
d = Path(sys.argv[1])
f.TEMPLATES_DIR, f.STATIC_DIR = d / "templates", d / "static"
bundles = sorted((d / "vendor").glob("plotly*.min.js"))  # an older frontend's bundle may be named otherwise
if bundles:
    f.PLOTLY_JS = bundles[0]
from packscope.backend.server.app import create_app
uvicorn.run(create_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def start_server(db: Path, frontend: Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """uvicorn serving `db`; frontend: another frontend/ folder whose pages it serves."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACKSCOPE_")}
    env["PACKSCOPE_DATABASE_URL"] = f"sqlite:///{db}"
    if frontend is None:
        command = [sys.executable, "-m", "uvicorn", "--factory", "packscope.backend.server.app:create_app"]
        command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    else:
        command = [sys.executable, "-c", OTHER_FRONTEND, str(frontend.resolve()), str(port)]
    server = subprocess.Popen(command, env=env, cwd=db.parent)  # not the checkout: alembic/ would shadow
    url = f"http://127.0.0.1:{port}"
    backend_scale.wait_until_serving(server, url)
    return server, url


class PageTimeout(Exception):
    """A page's condition did not hold in time (a round of --before's is then left out, and counted)."""


def collect_errors(page: sync_api.Page) -> list[str]:
    """The page's errors and its 5xx answers, as they come (said when a page times out)."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 500 else None)
    return errors


# Makes the browser context of one page's loads.
Contexts = Callable[[], sync_api.BrowserContext]
VIEWPORT = {"width": 1400, "height": 1000}


def off_the_record(browser: sync_api.Browser) -> Contexts:
    """Playwright's own contexts: the HTTP cache is kept from load to load, the code Chromium
    compiled is not (V8's code cache lives in a profile on disk), so a warm load compiles
    plotly.js again."""
    return lambda: browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]


def with_profile(playwright: sync_api.Playwright, folder: Path) -> Contexts:
    """Contexts of a browser with a profile on disk (a new one each, under `folder`), as a
    person's: from the third load of a script on, Chromium takes its compiled code from V8's code
    cache instead of compiling it again."""

    def new() -> sync_api.BrowserContext:
        profile = Path(tempfile.mkdtemp(dir=folder))
        return playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            viewport=VIEWPORT,  # type: ignore[arg-type]
        )

    return new


def page_times(
    contexts: Contexts,
    url: str,
    conditions: dict[str, str],
    repeat: int,
    bundle: Path | None = None,
    readings: dict[str, str] | None = None,
    breakdown: str | None = None,
) -> dict[str, Any]:
    """Per condition: ms from navigation until it held. The loads share one browser context, as a
    person's visits share a cache: the first is cold (plotly.js fetched and compiled), the rest
    reuse the HTTP cache (and, with a profile, V8's code cache: see with_profile); the median is
    of those. bundle: a plotly.js served
    in place of the server's. readings: JS expressions (ms) read once the conditions held; with
    series_answered and first_plotly_chart, their difference is reported too. breakdown: a JS
    expression giving an object of ms (or null) read once the conditions held, each key summed up
    as a condition is, under "breakdown"."""
    readings = readings or {}
    seen: dict[str, list[float]] = {name: [] for name in [*conditions, *readings]}
    parts: list[dict[str, float | None]] = []
    context = contexts()
    if bundle is not None:  # routing turns the HTTP cache off: every load fetches it anew
        body = bundle.read_bytes()
        context.route("**/vendor/plotly.min.js", lambda route: route.fulfill(body=body, content_type="text/javascript"))
    try:
        for load in range(repeat):
            page = context.new_page()
            errors = collect_errors(page)
            page.goto(url, wait_until="commit")
            for name, condition in conditions.items():
                held = f"() => ({condition}) ? performance.now() : false"
                try:
                    handle = page.wait_for_function(held, polling="raf", timeout=120_000)
                except sync_api.TimeoutError:
                    drawn = page.evaluate(f"() => {PLOTS}.filter({DRAWN}).map(p => p.closest('.chart').id)")
                    said = f"{url}, load {load} (0: cold): {name} did not hold within 120 s"
                    raise PageTimeout(f"{said}; drawn: {drawn}; errors: {errors}") from None
                seen[name].append(round(float(handle.json_value()), 1))
            for name, expression in readings.items():
                seen[name].append(round(float(page.evaluate(f"() => {expression}")), 1))
            if breakdown is not None:
                parts.append(page.evaluate(f"() => {breakdown}"))
            page.close()
    finally:
        context.close()
    if "series_answered" in seen and "first_plotly_chart" in seen:
        lag = zip(seen["first_plotly_chart"], seen["series_answered"], strict=True)
        seen["first_plotly_chart_after_series_answered"] = [round(a - b, 1) for a, b in lag]
    out: dict[str, Any] = {name: summary(ms) for name, ms in seen.items()}
    if parts:
        out["breakdown"] = parts  # each load's; breakdown_summary sums them up
    return out


def breakdown_summary(rounds: list[list[dict[str, float | None]]]) -> dict[str, Any]:
    """Per key of the page's breakdown (each round's loads, the first cold): the median of the
    cold loads and of the warm ones (ms, or bytes for *_bytes); with plotly.js's own time in the
    page (asked → run) and the headline's plotly drawing after it (run → plotted)."""
    for p in (p for loads in rounds for p in loads):
        # plotly.js asked: run_early.js's mark where it inserts the script, else (an async script
        # in the page's head) its request's start.
        asked = p.get("plotly_asked") if p.get("plotly_asked") is not None else p.get("plotly_js_asked")
        if asked is not None and p.get("plotly_ran") is not None:
            p["plotly_own_ms"] = p["plotly_ran"] - asked  # type: ignore[operator]
        if p.get("plotly_ran") is not None and p.get("headline_plotted") is not None:
            p["plotted_after_plotly_ran_ms"] = p["headline_plotted"] - p["plotly_ran"]  # type: ignore[operator]

    def median(values: list[float | None]) -> float | None:
        held = [v for v in values if v is not None]
        return round(statistics.median(held), 1) if held else None

    return {
        key: {
            "cold_median": median([loads[0].get(key) for loads in rounds]),
            "warm_median": median([p.get(key) for loads in rounds for p in loads[1:]]),
        }
        for key in rounds[0][0]
    }


def summary(ms: list[float]) -> dict[str, Any]:
    """The first (cold) load, and the median and range of the others (warm)."""
    warm = ms[1:]
    return {
        "cold_ms": ms[0],
        "warm_median_ms": statistics.median(warm) if warm else None,
        "warm_range_ms": [min(warm), max(warm)] if warm else None,
        "all_ms": ms,
    }


def summary_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """page_times' answers of several rounds, per condition: the median and range of the cold
    loads (one a round) and of the warm ones (all rounds together)."""
    out: dict[str, Any] = {}
    if "breakdown" in rounds[0]:
        out["breakdown"] = breakdown_summary([r["breakdown"] for r in rounds])
    for name in rounds[0]:
        if name == "breakdown":
            continue
        loads = [r[name]["all_ms"] for r in rounds]
        cold, warm = [ms[0] for ms in loads], [x for ms in loads for x in ms[1:]]
        out[name] = {
            "cold_median_ms": statistics.median(cold),
            "cold_range_ms": [min(cold), max(cold)],
            "warm_median_ms": statistics.median(warm) if warm else None,
            "warm_range_ms": [min(warm), max(warm)] if warm else None,
            "all_ms": loads,
        }
    return out


# plotly.js asked for by a page that holds nothing else, as run_early.js asks: ms from the
# script's insertion until it has run (its load event), the run page's plotly_own_ms.
PLOTLY_OWN = """() => new Promise((resolve, reject) => {
  const script = document.createElement('script');
  const asked = performance.now();
  script.onload = () => resolve(performance.now() - asked);
  script.onerror = () => reject(new Error('plotly.js did not load'));
  script.src = '/vendor/plotly.min.js';
  document.head.append(script);
})"""


def plotly_alone(contexts: Contexts, url: str, repeat: int, bundle: Path | None = None) -> dict[str, Any]:
    """The floor under the run page: plotly.js's own time (PLOTLY_OWN) on a page of the server
    that runs no script of its own (its 404 page), the same context rules as page_times: the
    server's bundle, or `bundle` in its place (routed: fetched anew on every load)."""
    context = contexts()
    if bundle is not None:
        body = bundle.read_bytes()
        context.route(
            f"{url}/vendor/plotly.min.js", lambda route: route.fulfill(body=body, content_type="text/javascript")
        )
    seen = []
    for _ in range(repeat):
        page = context.new_page()
        page.goto(f"{url}/plotly-alone")
        seen.append(round(float(page.evaluate(PLOTLY_OWN)), 1))
        page.close()
    context.close()
    return summary(seen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--intervals", type=int, default=1_000_000, help="intervals of the long run")
    ap.add_argument("--runs", type=int, default=200, help="runs on the runs page (the long one included)")
    ap.add_argument("--repeat", type=int, default=6, help="loads of each page (the first one cold)")
    ap.add_argument("--keep", type=Path, help="SQLite file to keep; if it exists (same sizes), reused")
    ap.add_argument("--before", type=Path, help="an earlier commit's frontend/ folder: its run page beside this one's")
    ap.add_argument("--rounds", type=int, default=1, help="with --before: rounds of the two run pages, alternating")
    ap.add_argument(
        "--only-run-page", action="store_true", help="leave out the runs page and the full bundle's run page"
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="each page's loads in a browser with a profile on disk (warm loads reuse V8's code cache, as a person's)",
    )
    args = ap.parse_args()
    if args.before is not None and not (args.before / "templates" / "run.html").exists():
        raise SystemExit(f"--before {args.before}: not a frontend/ folder (no templates/run.html)")
    if args.rounds < 1 or args.repeat < 1:
        raise SystemExit("--rounds and --repeat must be at least 1")
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.keep.resolve() if args.keep else Path(tmp) / "bench.db"
        reuse = db.exists()
        engine = make_engine(f"sqlite:///{db}")
        upgrade_schema(engine)
        server, url = start_server(db)
        before_server = None
        try:
            http = httpx.Client(base_url=url, timeout=300)
            fill_s = None
            if reuse:
                long = http.get("/api/v1/runs/long").json()
                if long.get("records") != args.intervals or http.get("/api/v1/runs").json()["total"] != args.runs:
                    raise SystemExit(f"{db} holds other sizes than --intervals/--runs ask for")
            else:
                fill_s = fill_runs(make_sessionmaker(engine), http, args)
            if args.before is not None:
                before_server, before_url = start_server(db, args.before)
            run_conditions = {
                "first_chart": FIRST_CHART,
                "first_plotly_chart": FIRST_PLOTLY_CHART,
                "all_charts": ALL_CHARTS,
            }
            answered = {"series_answered": SERIES_ANSWERED}
            out: dict[str, Any] = {}
            with sync_api.sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                contexts = with_profile(playwright, Path(tmp)) if args.profile else off_the_record(browser)
                if not args.only_run_page:
                    out["runs_page"] = {
                        "runs": args.runs,
                        **page_times(contexts, url, {"rows_shown": RUNS_SHOWN}, args.repeat),
                    }
                if args.before is None:
                    run_page = page_times(
                        contexts,
                        f"{url}/runs/long",
                        run_conditions,
                        args.repeat,
                        readings=answered,
                        breakdown=BREAKDOWN,
                    )
                    run_page["breakdown"] = breakdown_summary([run_page["breakdown"]])
                else:
                    fronts = {"after": url, "before": before_url}
                    seen: dict[str, list[dict[str, Any]]] = {name: [] for name in fronts}
                    loads = []
                    failed: dict[str, list[str]] = {name: [] for name in fronts}
                    for r in range(args.rounds):
                        for name in ["before", "after"] if r % 2 == 0 else ["after", "before"]:
                            try:
                                times = page_times(
                                    contexts,
                                    f"{fronts[name]}/runs/long",
                                    run_conditions,
                                    args.repeat,
                                    readings=answered,
                                    breakdown=BREAKDOWN,
                                )
                            except PageTimeout as timeout:  # left out, but counted and said
                                print(f"{name}, round {r}: {timeout}", file=sys.stderr)
                                failed[name].append(str(timeout))
                                continue
                            seen[name].append(times)
                            loads.append(round(os.getloadavg()[0], 2))
                    if not seen["after"] or not seen["before"]:
                        raise SystemExit(f"every round of a frontend timed out: {failed}")
                    out["rounds_timed_out"] = failed
                    run_page = summary_rounds(seen["after"])
                    out["run_page_before"] = {"frontend": str(args.before), **summary_rounds(seen["before"])}
                    out["load_avg_each_page"] = loads
                if not args.only_run_page:
                    # The same page with the full bundle in the partial one's place: what it cost before.
                    out["run_page_full_plotly_js"] = page_times(
                        contexts,
                        f"{url}/runs/long",
                        {"first_chart": FIRST_CHART, "first_plotly_chart": FIRST_PLOTLY_CHART},
                        args.repeat,
                        FULL_PLOTLY_JS,
                    )
                plotly_only = plotly_alone(contexts, url, args.repeat)
                plotly_full = plotly_alone(contexts, url, args.repeat, FULL_PLOTLY_JS)
                browser.close()
            out = {
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "cpus": os.cpu_count(),
                "load_avg_start": load_start,
                "load_avg": os.getloadavg(),
                "database": "sqlite",
                "chromium": CHROMIUM,
                "contexts": "a profile on disk each" if args.profile else "off the record",
                "run_page": {"intervals": args.intervals, "channels": len(CHANNELS), **run_page},
                **out,
                "plotly_js_alone": {"bundle": "served", "bytes": PLOTLY_JS.stat().st_size, **plotly_only},
                "plotly_js_full_alone": {
                    "bundle": "full (plotly wheel)",
                    "bytes": FULL_PLOTLY_JS.stat().st_size,
                    **plotly_full,
                },
                "fill_in_process_s": None if fill_s is None else round(fill_s, 1),
            }
        finally:
            for each in (server, before_server):
                if each is not None:
                    backend_scale.stop_server(each)
            engine.dispose()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
