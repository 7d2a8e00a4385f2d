"""Live latency: from posting an interval until open pages know of it, with `packscope serve
--workers 2` (so a batch stored by one worker must wake streams held by the other).

* post -> SSE: `--streams` open /stream connections (spread over both workers by the kernel);
  the time from just before the POST until each stream has the `interval` event for it;
* post -> page: the run page in Debian's chromium (Playwright); the time from just before the
  POST until the first animation frame whose headline chart's plotly data ends at the new
  interval's step, as the page's clock has it (a script the bench adds to the page looks each
  frame; the epoch clocks of this process and the browser's are the machine's one). Beside it,
  "polled": the same condition waited for through Playwright and timed here, as the bench did
  up to 2026-12-06 (it adds Playwright's round trip to the page and this process's wake-up).
  The page's own part splits into: the event's way into the page (post -> the page's
  EventSource), the wait from there until the headline's plotly call begins, the call, and the
  wait from its return to the frame.

Each post is one record; posts are `--gap-s` apart. On a fresh run and on a long one (`--big-url`,
a database holding run big-1000000 from bench/big_run.py; the posts extend it). A kept run's
agent has been silent since it was built, so the page would show it stale and never "live": the
case sends a heartbeat before opening the page, as a running agent does. Each post's figures
come side by side, with drawn p95 ÷ SSE p95 (issue 39's goal: at most 2), and the page's own part
(each post's drawn time less the median of its streams' SSE times). `--before DIR` measures
an earlier commit's page beside this one's, in alternating blocks of posts against the same
server (DIR: that commit's frontend/ folder). Prints one JSON object.

    python bench/live_latency.py --database sqlite --big-url sqlite:////tmp/psbench/1m.db
    python bench/live_latency.py --database postgresql \\
        --big-url postgresql+psycopg://postgres@127.0.0.1:5432/packscope_bench_1m
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import plotly
from backend_scale import wait_until_serving
from bench_data import record, run_body, scratch_database

from packscope.core.ports import free_port

# plotly.js whole, as the plotly wheel ships it ([dev]): what a --before frontend without the
# partial bundle (frontend/vendor/) loaded.
FULL_PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
HEADLINE = "document.querySelector('#chart-tflops .plot')"
# A 1M-interval run's page takes seconds to draw on a loaded 2-core machine: these are generous.
PAGE_READY_MS = 180_000
POST_DRAWN_MS = 60_000
# Added to the page before its own scripts (the page's CSP does not apply to it): what the page's
# stream delivered when, when each headline plotly call ran, each animation frame at which the
# headline's traces first reached a step, and the long tasks; all in epoch ms.
PROBE = """(() => {
  const probe = (window.__liveProbe = { arrived: [], calls: [], frames: [], long: [] });
  performance.setResourceTimingBufferSize(100000); // REQUESTS_SINCE reads them all
  // Tasks of 50 ms or more on the page's thread, [start, end]: an event arriving meanwhile waits.
  new PerformanceObserver((list) => {
    for (const t of list.getEntries()) {
      const start = performance.timeOrigin + t.startTime;
      probe.long.push([start, start + t.duration]);
    }
  }).observe({ type: "longtask" });
  const Source = window.EventSource;
  window.EventSource = class extends Source {
    constructor(...args) {
      super(...args);
      // Registered first: runs before the page's own listener of the same event.
      this.addEventListener("interval", (m) => {
        const i = /"interval":\\s*(\\d+)/.exec(m.data);
        probe.arrived.push([i ? Number(i[1]) : -1, Date.now()]);
      });
    }
  };
  const wrap = (plotly) => {
    for (const name of ["extendTraces", "react", "newPlot"]) {
      const call = plotly[name];
      plotly[name] = function (plot, ...rest) {
        const headline = plot?.closest?.("#chart-tflops");
        const began = Date.now();
        const out = call.call(this, plot, ...rest);
        if (headline) probe.calls.push([name, began, Date.now()]);
        return out;
      };
    }
  };
  let held;
  Object.defineProperty(window, "Plotly", {
    configurable: true,
    get: () => held,
    set: (value) => { held = value; if (value) wrap(value); },
  });
  let reached = -Infinity;
  const frame = () => {
    const plot = document.querySelector("#chart-tflops .plot");
    for (const t of plot?.data || []) {
      const last = t.x && t.x.length ? t.x[t.x.length - 1] : -Infinity;
      if (typeof last === "number" && last > reached) {
        reached = last;
        probe.frames.push([last, Date.now()]);
      }
    }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
})();"""
# The headline chart's plotly traces reach `step` (its x axis is the step by default).
# (A function, not an expression: the page's CSP forbids evaluating strings.)
# The paths (run id left out) of the page's requests begun after an epoch ms.
REQUESTS_SINCE = """since => performance.getEntriesByType("resource")
  .filter(e => performance.timeOrigin + e.startTime >= since)
  .map(e => new URL(e.name).pathname.replace(/\\/runs\\/[^/]+/, "/runs/ID"))"""
CHART_REACHES = (
    f"step => {{ const p = {HEADLINE}; "
    "return !!p && !!p.data && p.data.some(t => t.x && t.x.length && t.x[t.x.length - 1] >= step); }"
)


def serve(database_url: str, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACKSCOPE_")}
    command = [sys.executable, "-m", "packscope", "serve", "--port", str(port), "--workers", str(workers)]
    command += ["--database-url", database_url, "--no-access-log"]
    # Not from the checkout, whose alembic/ would shadow the library.
    server = subprocess.Popen(command, env=env, cwd=tempfile.gettempdir(), stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(server, url)
    except BaseException:  # not answering in time (a loaded machine): not left running behind the bench
        server.terminate()
        server.wait(20)
        raise
    return server, url


def heartbeats(url: str, run_id: str, stop: threading.Event, every_s: float = 10.0) -> None:
    """The agent's heartbeat every `every_s` until stopped (the first one at once)."""
    while not stop.is_set():
        with suppress(httpx.HTTPError):  # the server stopping under it
            answer = httpx.post(f"{url}/api/v1/runs/{run_id}/heartbeat", json={"every_s": every_s})
            assert answer.status_code == 204, answer.text
        if stop.wait(every_s):
            return


def listen(url: str, run_id: str, into: queue.Queue[tuple[int, float]], opened: threading.Event) -> None:
    """(interval, arrival) of every event of the run's stream, until the server stops."""
    with suppress(httpx.HTTPError), httpx.stream("GET", f"{url}/api/v1/runs/{run_id}/stream", timeout=None) as answer:
        opened.set()
        lines = answer.iter_lines()
        for line in lines:
            if line == "event: interval":
                data = json.loads(next(lines).removeprefix("data: "))
                into.put((int(data["interval"]), time.monotonic()))


def percentiles(ms: list[float]) -> dict[str, Any]:
    if not ms:
        return {"n": 0}
    ordered = sorted(ms)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    median = statistics.median(ms)
    return {"n": len(ms), "p50_ms": round(median, 1), "p95_ms": round(p95, 1), "max_ms": round(ordered[-1], 1)}


def open_page(browser: Any, url: str, run_id: str, first: int, before: Path | None) -> Any:
    """The run page, live, its headline chart drawn up to interval `first`. before: a frontend
    folder of an earlier commit whose static modules and plotly bundle the page loads instead of
    this checkout's (the server, its templates and its answers stay this checkout's)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.add_init_script(PROBE)
    if before is not None:
        bundles = sorted((before / "vendor").glob("plotly*.min.js"))  # named plotly-cartesian.min.js until 2026-12-07
        bundle = bundles[0] if bundles else FULL_PLOTLY_JS  # before the partial bundle: the full one
        page.route("**/vendor/plotly.min.js", lambda route: route.fulfill(path=bundle, content_type="text/javascript"))
        page.route(
            "**/static/*", lambda route: route.fulfill(path=before / "static" / route.request.url.split("/static/")[1])
        )
    page.goto(f"{url}/runs/{run_id}")
    page.wait_for_function(CHART_REACHES, arg=first * 10, polling="raf", timeout=PAGE_READY_MS)
    page.wait_for_selector("#live.on", timeout=PAGE_READY_MS)  # the page's stream is open
    return page


# What each post's figures are, by name (ms); the page's from its probe (PROBE).
FIGURES = ["sse", "page", "polled", "after", "page_sse", "busy", "wait", "call", "to_frame"]


def page_times(probe: dict[str, list[list[Any]]], interval: int, posted: float) -> dict[str, float]:
    """One post's times in the page (ms from `posted`, an epoch ms): the first frame with the
    interval's step drawn, the event's arrival, and the headline plotly call that drew it."""
    step = (interval + 1) * 10
    frame = next(at for reached, at in probe["frames"] if reached >= step)
    arrived = next((at for i, at in probe["arrived"] if i >= interval), None)
    # The call that drew it: the last to return before that frame.
    call = max((c for c in probe["calls"] if c[2] <= frame), key=lambda c: c[2], default=None)
    out = {"page": frame - posted}
    if arrived is not None:
        out["page_sse"] = arrived - posted
        # How much of that the page's thread spent in long tasks (the event waits behind them).
        out["busy"] = sum(max(0.0, min(b, arrived) - max(a, posted)) for a, b in probe["long"])
        if call is not None and call[1] >= arrived:
            out |= {"wait": call[1] - arrived, "call": call[2] - call[1], "to_frame": frame - call[2]}
    return out


def block(
    http: httpx.Client,
    run_id: str,
    first: int,
    args: argparse.Namespace,
    streams: list[queue.Queue[tuple[int, float]]],
    page: Any,
    requests: dict[str, int],
) -> dict[str, list[float]]:
    """`args.posts` posts from interval `first` on: each FIGURES' ms (sse: of every stream; after:
    each post's drawn ms less the median of its SSE ms); the page's requests counted into
    `requests` by path."""
    time.sleep(1.0)
    for q in streams:  # the state each stream sent when it opened, and anything older
        while not q.empty():
            q.get()
    rng = random.Random(f"{run_id}-{first}")
    seen: dict[str, list[float]] = {name: [] for name in FIGURES}
    posts: list[tuple[int, float, list[float]]] = []
    began = time.time() * 1e3
    for k in range(args.posts):
        interval = first + k
        body = {"intervals": [record(interval, 0, rng)]}
        posted_epoch = time.time() * 1e3
        posted = time.monotonic()
        answer = http.post(f"/api/v1/runs/{run_id}/intervals", json=body)
        assert answer.status_code == 200 and answer.json()["accepted"] == 1, answer.text
        heard = []
        for q in streams:
            while True:
                got, at = q.get(timeout=30)
                if got >= interval:
                    heard.append((at - posted) * 1e3)
                    break
        seen["sse"] += heard
        if page is not None:
            page.wait_for_function(CHART_REACHES, arg=(interval + 1) * 10, polling="raf", timeout=POST_DRAWN_MS)
            seen["polled"].append((time.monotonic() - posted) * 1e3)
            posts.append((interval, posted_epoch, heard))
        time.sleep(args.gap_s)
    if page is not None:
        probe = page.evaluate("() => window.__liveProbe")
        # The page's requests during the block, by path: whether it asks for anything per event.
        for path in page.evaluate(REQUESTS_SINCE, began):
            requests[path] = requests.get(path, 0) + 1
        for interval, posted_epoch, heard in posts:
            times = page_times(probe, interval, posted_epoch)
            times["after"] = times["page"] - statistics.median(heard)
            for name, ms in times.items():
                seen[name].append(ms)
    return seen


def summary(seen: dict[str, list[float]], requests: dict[str, int]) -> dict[str, Any]:
    """after: each post's page time less the median of its streams' SSE times, the page's own
    part, paired post by post (the load's swings between posts cancel out of it)."""
    sse, drawn, polled = percentiles(seen["sse"]), percentiles(seen["page"]), percentiles(seen["polled"])

    def ratio(page: dict[str, Any]) -> float | None:
        return round(page["p95_ms"] / sse["p95_ms"], 2) if page["n"] and sse["n"] else None

    return {
        "post_to_sse": sse,
        "post_to_page": drawn,
        "page_p95_over_sse_p95": ratio(drawn),
        "page_after_sse": percentiles(seen["after"]),
        "post_to_page_polled": polled,
        "polled_p95_over_sse_p95": ratio(polled),
        # The page's part, split: the event into the page's EventSource (and how much of that
        # the page's thread was held by long tasks), the wait from there to the headline's plotly
        # call, the call, and from its return to the frame.
        "post_to_page_eventsource": percentiles(seen["page_sse"]),
        "long_tasks_before_event": percentiles(seen["busy"]),
        "eventsource_to_call": percentiles(seen["wait"]),
        "plotly_call": percentiles(seen["call"]),
        "call_to_frame": percentiles(seen["to_frame"]),
        "page_requests_per_post": {
            path: round(n / max(1, len(seen["page"])), 2) for path, n in sorted(requests.items())
        },
    }


def measure(url: str, run_id: str, first: int, args: argparse.Namespace, browser: Any) -> dict[str, Any]:
    """`args.rounds` blocks of posts, each with a fresh page; with --before, as many more with the
    earlier frontend's page, the two alternating (before first in odd rounds)."""
    http = httpx.Client(base_url=url, timeout=30)
    streams = [queue.Queue[tuple[int, float]]() for _ in range(args.streams)]
    for q in streams:
        opened = threading.Event()
        threading.Thread(target=listen, args=(url, run_id, q, opened), daemon=True).start()
        opened.wait(10)
    fronts: list[tuple[str, Path | None]] = [("now", None)]
    if args.before is not None:
        fronts.append(("before", args.before))
    seen: dict[str, dict[str, list[float]]] = {name: {f: [] for f in FIGURES} for name, _ in fronts}
    requests: dict[str, dict[str, int]] = {name: {} for name, _ in fronts}
    for r in range(args.rounds):
        for name, before in fronts if r % 2 == 0 else fronts[::-1]:
            page = None if browser is None else open_page(browser, url, run_id, first, before)
            for figure, more in block(http, run_id, first, args, streams, page, requests[name]).items():
                seen[name][figure].extend(more)
            first += args.posts
            if page is not None:
                page.close()
    http.close()
    return {name: summary(ms, requests[name]) for name, ms in seen.items()}


def case(database_url: str, run_id: str, args: argparse.Namespace, browser: Any, fresh: bool) -> dict[str, Any]:
    stop = threading.Event()
    server, url = serve(database_url, args.workers)
    try:
        if fresh:
            assert httpx.post(f"{url}/api/v1/runs", json=run_body(run_id)).status_code == 201
            seed = {"intervals": [record(i, 0, random.Random(i)) for i in range(4)]}
            assert httpx.post(f"{url}/api/v1/runs/{run_id}/intervals", json=seed).status_code == 200
        # A kept run silent for 3 heartbeats (90 s) is shown stale, its page never "live": beat as an agent does.
        threading.Thread(target=heartbeats, args=(url, run_id, stop), daemon=True).start()
        summary = httpx.get(f"{url}/api/v1/runs/{run_id}").json()
        first = int(summary["last_step"]) // 10  # the next interval index
        return {"run_id": run_id, "intervals_before": summary["records"], **measure(url, run_id, first, args, browser)}
    finally:
        stop.set()
        server.terminate()
        server.wait(20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--big-url", help="a database holding big-1000000 (bench/big_run.py); left out: fresh run only")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--streams", type=int, default=6)
    ap.add_argument("--posts", type=int, default=30)
    ap.add_argument("--gap-s", type=float, default=0.3)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--rounds", type=int, default=1, help="blocks of --posts posts, each with a fresh page")
    ap.add_argument(
        "--before",
        type=Path,
        help="the frontend/ folder of an earlier commit (git archive REV frontend | tar -x -C DIR): its page "
        "measured beside this checkout's, in alternating blocks against the same server",
    )
    args = ap.parse_args()
    out: dict[str, Any] = {
        "database": args.database,
        "workers": args.workers,
        "streams": args.streams,
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
    }
    playwright = browser = None
    if not args.no_browser:
        from playwright import sync_api

        playwright = sync_api.sync_playwright().start()
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    try:
        with scratch_database(args.database) as url:
            out["fresh"] = case(url, "live", args, browser, fresh=True)
        if args.big_url:
            out["long"] = case(args.big_url, "big-1000000", args, browser, fresh=False)
    finally:
        if browser is not None:
            browser.close()
        if playwright is not None:
            playwright.stop()
    out["load_avg_end"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
