"""What one live extension's plotly pass costs on the run page's headline chart, and what the
figure's parts take of it (issue 39's post -> drawn: the page's own part is this pass).

A fresh run of --intervals intervals (one record each) is served (`packscope serve`, SQLite) and
its run page opened in Debian's chromium. Its headline chart's figure (traces, layout, config) is
copied into a plot of the same size, which then grows by one point a trace (Plotly.extendTraces,
as a live event makes it grow) --passes times, a frame between passes; each pass is timed in the
page. Variants of the same figure, in turn, --rounds times: as drawn (`page`); without the
traces plotly skips (`visible: false`: the bands of a run whose intervals are one point each);
without the axes' titles; without both. Prints JSON: each variant's pass in ms, p50 and p90 of
each round, and their medians over the rounds.

    python bench/plotly_pass.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

import httpx
from bench_data import record, run_body, scratch_database
from live_latency import CHROMIUM, CHROMIUM_ARGS, HEADLINE, serve

VARIANTS = ["page", "without skipped traces", "without axis titles", "without both"]

# Copies the headline's figure into a plot of its size, then times `passes` one-point extensions.
PASSES = """async ([variant, passes]) => {
  const source = HEADLINE;
  let traces = source.data.map((t) => ({ ...t, x: [...t.x], y: [...t.y] }));
  const layout = JSON.parse(JSON.stringify(source.layout));
  if (variant.includes("skipped") || variant.includes("both")) traces = traces.filter((t) => t.visible !== false);
  if (variant.includes("titles") || variant.includes("both")) {
    for (const axis of ["xaxis", "yaxis"]) layout[axis] = { ...layout[axis], title: { text: "" } };
  }
  const plot = document.createElement("div");
  Object.assign(plot.style, { width: `${source.clientWidth}px`, height: `${source.clientHeight}px` });
  document.body.append(plot);
  await Plotly.newPlot(plot, traces, layout, source._context);
  const indices = traces.map((_, i) => i);
  let x = Math.max(...traces[0].x);
  const ms = [];
  for (let n = 0; n < passes; n++) {
    x += 10;
    const update = { x: indices.map(() => [x]), y: traces.map((t) => [t.y[t.y.length - 1]]) };
    const t0 = performance.now();
    Plotly.extendTraces(plot, update, indices);
    ms.push(performance.now() - t0);
    await new Promise((frame) => requestAnimationFrame(frame));
  }
  Plotly.purge(plot);
  plot.remove();
  ms.sort((a, b) => a - b);
  return { traces: traces.length, p50: ms[Math.floor(passes / 2)], p90: ms[Math.floor(passes * 0.9)] };
}""".replace("HEADLINE", HEADLINE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--intervals", type=int, default=30)
    ap.add_argument("--passes", type=int, default=60, help="timed extensions of each variant in a round")
    ap.add_argument("--rounds", type=int, default=5, help="the variants in turn, this many times")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright  # [dev]: the benches' browser

    with scratch_database("sqlite") as database_url:
        server, url = serve(database_url, 1)
        try:
            rng = random.Random(0)
            httpx.post(f"{url}/api/v1/runs", json=run_body("pass")).raise_for_status()
            for i in range(args.intervals):
                body = {"intervals": [record(i, 0, rng)]}
                httpx.post(f"{url}/api/v1/runs/pass/intervals", json=body).raise_for_status()
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{url}/runs/pass")
                page.wait_for_function(f"() => {{ const p = {HEADLINE}; return !!p && !!p.data && !!p.data.length; }}")
                kinds = page.evaluate(f"() => {HEADLINE}.data.map((t) => [t.meta?.kind, t.visible !== false])")
                rounds: dict[str, list[dict]] = {v: [] for v in VARIANTS}
                for _ in range(args.rounds):
                    for variant in VARIANTS:
                        rounds[variant].append(page.evaluate(PASSES, [variant, args.passes]))
                browser.close()
        finally:
            server.terminate()
            server.wait(20)
    out = {
        "intervals": args.intervals,
        "passes": args.passes,
        "headline_traces": [{"kind": kind, "drawn": drawn} for kind, drawn in kinds],
        "variants": {
            v: {
                "traces": rs[0]["traces"],
                "p50_ms": [round(r["p50"], 2) for r in rs],
                "p90_ms": [round(r["p90"], 2) for r in rs],
                "median_p50_ms": round(statistics.median(r["p50"] for r in rs), 2),
                "median_p90_ms": round(statistics.median(r["p90"] for r in rs), 2),
            }
            for v, rs in rounds.items()
        },
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
