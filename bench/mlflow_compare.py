"""packscope against MLflow's tracking server on the operations both have, in one invocation.

Each server runs on 127.0.0.1 over its own new SQLite file, in one server process (MLflow:
`mlflow server --workers 1`, whatever its own web stack is; packscope: uvicorn, as
bench/backend_scale.py starts it), and the two are measured in turn with the same load:

* ingest: the same wire records (bench_data.record), batches of 64 records, 1 and 8 senders (one
  rank each). MLflow gets each record's numeric fields as metrics at step = interval through
  `runs/log-batch` (at most 1000 metrics a request, so a 64-record batch is several requests);
  the length histograms and sync sites have no MLflow counterpart and are not sent to it, so
  MLflow stores less per record. rows/s counts records; server CPU per record comes from /proc
  (the server process and its children).
* series: a run of --intervals records on each side, then packscope's chart series
  (`/series?max_points=1000`, every metric at once) against MLflow's sampled metric history
  (`get-history-bulk-interval`, max_results=1000, the call its run charts make) of one metric,
  the only one the MLflow run holds (filled through log-batch, 1000 steps a request; packscope's
  run is filled in this process through its ingest function, as in backend_scale.py).
* runs list: 200 runs on each side; packscope's `GET /api/v1/runs?limit=200` against MLflow's
  `runs/search` with max_results=200.

MLflow has no CSV export of a run's metrics and no sync sites; those are measured by
backend_scale.py alone. MLflow is not a packscope dependency: give the `mlflow` executable of
any environment (`--mlflow PATH`); without it the bench stops with a message.

    python bench/mlflow_compare.py --mlflow /path/to/venv/bin/mlflow [--intervals 100000] [--batches 64] [--rounds 4]

`--rounds N` measures both sides N times, each round on new files, the two taking turns at going
first (packscope first in odd rounds), so that a drift of the machine's speed during the run
lands on both; the ratios are given per round and as their median and range.

Prints one JSON object: each side's figures and packscope ÷ MLflow ratios (for rates, > 1 is
packscope faster; for times and CPU, < 1 is packscope cheaper).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import httpx
from backend_scale import BATCH, fill_run, p, run_senders, start_server, stop_server
from bench_data import record, run_body

from packscope.backend.store.db import make_engine, make_sessionmaker, upgrade_schema
from packscope.core.ports import free_port

SERIES_KEY = "gpu_time_s"  # the metric of MLflow's series run
MLFLOW_MAX_METRICS = 1000  # log-batch's limit per request


# -- the same records, as MLflow metrics -----------------------------------------------------------
def metrics_of(r: dict[str, Any]) -> list[dict[str, Any]]:
    """A wire record's numeric fields (nested ones as parent.name) as MLflow metrics at its interval."""
    out: list[dict[str, Any]] = []
    timestamp = int(r["wall_end"] * 1000)

    def add(key: str, value: Any) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            out.append({"key": key, "value": float(value), "timestamp": timestamp, "step": r["interval"]})

    for key, value in r.items():
        if isinstance(value, dict) and key in ("gpu", "syncs"):
            for name, inner in value.items():
                add(f"{key}.{name}", inner)
        elif key not in ("interval", "rank"):
            add(key, value)
    return out


def log_batch_bodies(records: list[dict[str, Any]], run_id: str) -> list[bytes]:
    """The log-batch requests that carry `records`' metrics, at most MLFLOW_MAX_METRICS each."""
    metrics = [m for r in records for m in metrics_of(r)]
    return [
        json.dumps({"run_id": run_id, "metrics": metrics[at : at + MLFLOW_MAX_METRICS]}).encode()
        for at in range(0, len(metrics), MLFLOW_MAX_METRICS)
    ]


# -- MLflow's server --------------------------------------------------------------------------------
def start_mlflow(mlflow: str, folder: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += [
        "--backend-store-uri",
        f"sqlite:///{folder}/mlflow.db",
        "--default-artifact-root",
        f"{folder}/artifacts",
    ]
    # Its own process group, so stopping it also stops the web server it starts.
    server = subprocess.Popen(command, cwd=folder, start_new_session=True, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            raise SystemExit("the MLflow server did not start")
        time.sleep(0.5)


def mlflow_run(http: httpx.Client, experiment_id: str, name: str) -> str:
    response = http.post(
        "/api/2.0/mlflow/runs/create",
        json={"experiment_id": experiment_id, "run_name": name, "start_time": int(time.time() * 1000)},
    )
    response.raise_for_status()
    return str(response.json()["run"]["info"]["run_id"])


# -- the measurements, one shape for both sides -----------------------------------------------------
Bodies = Callable[[str, list[dict[str, Any]]], list[bytes]]  # (run name, records) -> one batch's requests


def _packscope_bodies(_name: str, records: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps({"intervals": records}).encode()]


def ingest_rounds(
    server_pid: int, args: argparse.Namespace, new_run: Callable[[str], str], bodies_of: Bodies
) -> list[Any]:
    """A warm-up round (8 senders, --warmup batches in all: a served process is warm, its first
    calls are not its rate), then 1 and 8 senders, each into a new run (`new_run(name)` creates
    it and answers the URL to post its batches to)."""
    ingest(server_pid, 8, max(1, args.warmup // 8), bodies_of, "warm-up", new_run("warm-up"))
    return [ingest(server_pid, n, args.batches // n, bodies_of, f"ingest-{n}", new_run(f"ingest-{n}")) for n in (1, 8)]


def ingest(server_pid: int, senders: int, batches: int, bodies_of: Bodies, name: str, post: str) -> dict[str, Any]:
    """`senders` threads post `batches` batches of 64 records each (one rank a sender) to the run
    `name`; `bodies_of` turns a batch into its request bodies, posted to the URL `post`."""
    rng = random.Random(1)
    requests = {
        rank: [bodies_of(name, [record(b * BATCH + i, rank, rng) for i in range(BATCH)]) for b in range(batches)]
        for rank in range(senders)
    }
    errors: list[str] = []
    scheme, _, host, path = post.split("/", 3)
    base, path = f"{scheme}//{host}", f"/{path}"

    def send(rank: int) -> None:
        with httpx.Client(base_url=base, timeout=120) as client:
            for batch in requests[rank]:
                for body in batch:
                    response = client.post(path, content=body, headers={"Content-Type": "application/json"})
                    if response.status_code != 200:
                        errors.append(response.text[:200])

    seconds, cpu = run_senders(server_pid, senders, send)
    rows = senders * batches * BATCH
    return {
        "senders": senders,
        "rows": rows,
        "requests": sum(len(b) for batches in requests.values() for b in batches),
        "errors": len(errors),
        "rows_per_s": round(rows / seconds, 1),
        "server_cpu_us_per_row": round(cpu / rows * 1e6, 1),
    }


def timed(http: httpx.Client, method: str, path: str, repeat: int, **kwargs: Any) -> dict[str, float]:
    seconds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        response = http.request(method, path, **kwargs)
        seconds.append(time.perf_counter() - t0)
        assert response.status_code == 200, (path, response.text[:200])
    return {"ms_p50": p(seconds, 0.5), "ms_p95": p(seconds, 0.95)}


def bench_packscope(folder: str, args: argparse.Namespace) -> dict[str, Any]:
    database_url = f"sqlite:///{folder}/packscope.db"
    engine = make_engine(database_url)
    upgrade_schema(engine)
    server, url = start_server(database_url)
    try:
        http = httpx.Client(base_url=url, timeout=300)

        def new_run(name: str) -> str:
            assert http.post("/api/v1/runs", json=run_body(name)).status_code == 201
            return f"{url}/api/v1/runs/{name}/intervals"

        out: dict[str, Any] = {"ingest": ingest_rounds(server.pid, args, new_run, _packscope_bodies)}
        fill_run(make_sessionmaker(engine), http, "series", args.intervals)
        out["series"] = timed(http, "GET", "/api/v1/runs/series/series?max_points=1000", args.repeat)
        out["series"]["points"] = http.get("/api/v1/runs/series/series?max_points=1000").json()["points"]
        for i in range(200 - 3):
            http.post("/api/v1/runs", json=run_body(f"small-{i}")).raise_for_status()
        out["runs_list"] = timed(http, "GET", "/api/v1/runs?limit=200", args.repeat)
        out["runs_list"]["runs"] = len(http.get("/api/v1/runs?limit=200").json()["runs"])
        return out
    finally:
        stop_server(server)
        engine.dispose()


def bench_mlflow(folder: str, args: argparse.Namespace) -> dict[str, Any]:
    server, url = start_mlflow(args.mlflow, folder)
    try:
        http = httpx.Client(base_url=url, timeout=300)
        created = http.post("/api/2.0/mlflow/experiments/create", json={"name": "bench"})
        created.raise_for_status()
        experiment = created.json()["experiment_id"]
        runs: dict[str, str] = {}

        def new_run(name: str) -> str:
            runs[name] = mlflow_run(http, experiment, name)
            return f"{url}/api/2.0/mlflow/runs/log-batch"

        def bodies(name: str, records: list[dict[str, Any]]) -> list[bytes]:
            return log_batch_bodies(records, runs[name])

        out: dict[str, Any] = {"ingest": ingest_rounds(server.pid, args, new_run, bodies)}
        run_id = mlflow_run(http, experiment, "series")
        t0 = time.perf_counter()
        for start in range(0, args.intervals, MLFLOW_MAX_METRICS):
            steps = range(start, min(start + MLFLOW_MAX_METRICS, args.intervals))
            metrics = [
                {"key": SERIES_KEY, "value": 0.4 + step % 7 / 100, "timestamp": step, "step": step} for step in steps
            ]
            http.post("/api/2.0/mlflow/runs/log-batch", json={"run_id": run_id, "metrics": metrics}).raise_for_status()
        out["series_fill_s"] = round(time.perf_counter() - t0, 1)
        path = (
            f"/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval?run_ids={run_id}"
            f"&metric_key={SERIES_KEY}&max_results=1000"
        )
        out["series"] = timed(http, "GET", path, args.repeat)
        out["series"]["points"] = len(http.get(path).json()["metrics"])
        for i in range(200 - 3):
            mlflow_run(http, experiment, f"small-{i}")
        search = {"experiment_ids": [experiment], "max_results": 200}
        out["runs_list"] = timed(http, "POST", "/api/2.0/mlflow/runs/search", args.repeat, json=search)
        out["runs_list"]["runs"] = len(http.post("/api/2.0/mlflow/runs/search", json=search).json()["runs"])
        return out
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


def ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for a, b in zip(ours["ingest"], theirs["ingest"], strict=True):
        n = a["senders"]
        out[f"ingest_rows_per_s_{n}_senders"] = round(a["rows_per_s"] / b["rows_per_s"], 2)
        out[f"server_cpu_per_row_{n}_senders"] = round(a["server_cpu_us_per_row"] / b["server_cpu_us_per_row"], 3)
    for read in ("series", "runs_list"):
        for q in ("ms_p50", "ms_p95"):
            out[f"{read}_{q}"] = round(ours[read][q] / theirs[read][q], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mlflow", default=shutil.which("mlflow"), help="the mlflow executable (default: on PATH)")
    ap.add_argument("--intervals", type=int, default=100_000, help="records in the series run of each side")
    ap.add_argument("--batches", type=int, default=64, help="batches of 64 records per ingest measurement")
    ap.add_argument("--repeat", type=int, default=20, help="timed repetitions per read")
    ap.add_argument("--warmup", type=int, default=16, help="batches posted (8 senders) before the ingest is measured")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of both sides, taking turns at going first")
    args = ap.parse_args()
    if not args.mlflow or not os.access(args.mlflow, os.X_OK):
        ap.error("no mlflow executable: install MLflow in any environment and pass --mlflow PATH/bin/mlflow")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # finally clauses stop the servers
    version = subprocess.run([args.mlflow, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    result: dict[str, Any] = {"mlflow": version, "cpus": os.cpu_count(), "load_avg_start": os.getloadavg()}
    sides = {"packscope": bench_packscope, "mlflow_server": bench_mlflow}
    rounds = []
    for k in range(args.rounds):
        order = list(sides) if k % 2 == 0 else list(sides)[::-1]
        one: dict[str, Any] = {"first": order[0], "load_avg_start": os.getloadavg()}
        for side in order:
            with tempfile.TemporaryDirectory() as folder:
                one[side] = sides[side](folder, args)
        one["packscope_over_mlflow"] = ratios(one["packscope"], one["mlflow_server"])
        rounds.append(one)
        print(f"round {k + 1}: {json.dumps(one['packscope_over_mlflow'])}", file=sys.stderr)
    result["load_avg_end"] = os.getloadavg()
    result["rounds"] = rounds
    result["packscope_over_mlflow"] = {}
    for key in rounds[0]["packscope_over_mlflow"]:
        values = [r["packscope_over_mlflow"][key] for r in rounds]
        spread = {"median": statistics.median(values), "range": [min(values), max(values)]}
        result["packscope_over_mlflow"][key] = spread
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
