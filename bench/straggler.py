"""One rank slowed on purpose in a data-parallel run: does the diagnosis find it and price it?

Issue 40's straggler check, runnable on several GPUs (NCCL) or on the CPU (gloo). For each case
this starts the reference trainer under torchrun, feeding a local `packscope serve` (SQLite, alerts
judged every 0.2 s with short streaks), then reads what a user would see:

* ``none``: no fault; neither the ledger's stragglers term nor the straggler alert may name a rank;
* ``apart``: `--fault slow-rank:rank=R,factor=F`, the fault as the alert tests inject it, with a
  barrier between steps that keeps the others' wait out of their timed steps;
* ``real``: the same with ``apart=off``: no barrier, as in a real job, where the others wait for
  the slow rank inside their own step (the gradient all-reduce).

The slowdown adds (F - 1) x the slow rank's own step work to every step; the others lose that
time waiting. The priced wait is the ledger's stragglers term over the fault's intervals
(``ms_per_step`` is the wait averaged over all ranks, so the others' wait is that x N / (N - 1)).
Prints JSON; exit 1 if a case misses issue 40's bar (named rank, priced within 30%, silent without
a fault).

    python bench/straggler.py [--parallel ddp|fsdp2] [--nproc 2] [--device cpu|cuda] [--factor 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

THRESHOLDS = {"warmup_intervals": 1, "baseline_intervals": 2, "straggler_pct": 30.0, "straggler_intervals": 2}
TOLERANCE = 0.30


def serve(db: Path, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PACKSCOPE_ALERT_THRESHOLDS": json.dumps(THRESHOLDS),
        "PACKSCOPE_ALERT_SWEEP_S": "0.2",
    }
    command = [sys.executable, "-m", "packscope", "serve", "--database", f"sqlite:///{db}", "--port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/runs", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the server did not start")


def train(args: argparse.Namespace, url: str, run_id: str, fault: str | None) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc)]
    command += ["-m", "packscope", "train", "--device", args.device, "--preset", args.preset]
    command += ["--steps", str(args.steps), "--log-every", str(args.log_every), "--parallel", args.parallel]
    command += ["--no-progress", "--server", url, "--run-id", run_id, "--name", run_id, "--project", "straggler"]
    command += args.train_args.split()
    if fault:
        command += ["--fault", fault]
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if args.device == "cpu" else dict(os.environ)
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{run_id}: the trainer failed:\n{done.stderr[-3000:]}")


def read(url: str, run_id: str, first_step: int) -> dict[str, Any]:
    """The straggler term over the fault's intervals, the slowest rank of the ranks panel, the alerts."""
    ledger = httpx.get(f"{url}/api/v1/runs/{run_id}/ledger", params={"first_step": first_step}, timeout=30).json()
    term = next(t for t in ledger["terms"] if t["name"] == "stragglers")
    time.sleep(1.0)  # a judging round after the last interval
    alerts = httpx.get(f"{url}/api/v1/runs/{run_id}/alerts", timeout=30).json()
    ranks = httpx.get(f"{url}/api/v1/runs/{run_id}/ranks", params={"max_points": 200}, timeout=30).json()
    return {
        "step_ms": ledger.get("step_time_ms"),
        "stragglers_ms_per_step": term["ms_per_step"],
        "stragglers_status": term["status"],
        "named_rank": (term.get("detail") or {}).get("slowest_rank"),
        "slowest_ms": (term.get("detail") or {}).get("slowest_ms"),
        "mean_ms": (term.get("detail") or {}).get("mean_ms"),
        "straggler_alerts": [a.get("subject") for a in alerts if a.get("rule") == "straggler"],
        "ranks_panel_keys": sorted(ranks)[:8] if isinstance(ranks, dict) else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parallel", choices=("ddp", "fsdp2"), default="ddp")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--fault-from", type=int, default=16, help="the first slowed step (after the alerts' baseline)")
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument(
        "--train-args",
        default="--pack-length 128 --packs-per-step 2 --data-short-median 24 --data-long-median 96",
        help="more `packscope train` arguments (the CPU default: a tiny step)",
    )
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--port", type=int, default=8817)
    args = ap.parse_args()

    url = f"http://127.0.0.1:{args.port}"
    fault = f"slow-rank:rank={args.rank},factor={args.factor},from={args.fault_from}"
    cases = {"none": None, "apart": fault, "real": f"{fault},apart=off"}
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_avg": os.getloadavg()}
    out.update({k: getattr(args, k) for k in ("parallel", "nproc", "device", "preset", "steps", "factor", "rank")})
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = serve(Path(tmp) / "straggler.db", args.port)
        try:
            for name, text in cases.items():
                run_id = f"straggler-{args.parallel}-{name}"
                train(args, url, run_id, text)
                out[name] = read(url, run_id, args.fault_from)
        finally:
            server.terminate()
            server.wait(timeout=30)
    # What the fault adds each step: (F - 1) x the slow rank's own work, its step without the fault.
    own_ms = out["none"]["step_ms"]
    added_ms = (args.factor - 1) * own_ms
    others = args.nproc / (args.nproc - 1)
    for name in ("apart", "real"):
        case = out[name]
        priced = None if case["stragglers_ms_per_step"] is None else case["stragglers_ms_per_step"] * others
        case["added_ms_per_step"] = added_ms
        case["others_wait_priced_ms"] = priced
        case["priced_over_added"] = None if priced is None else priced / added_ms
        if case["named_rank"] != args.rank or priced is None or abs(priced / added_ms - 1) > TOLERANCE:
            failures.append(f"{name}: rank {case['named_rank']} named, priced {priced} ms for {added_ms:.4g} ms added")
        if f"rank {args.rank}" not in case["straggler_alerts"]:
            failures.append(f"{name}: no straggler alert on rank {args.rank} ({case['straggler_alerts']})")
    if out["none"]["straggler_alerts"]:
        failures.append(f"none: straggler alerts without a fault: {out['none']['straggler_alerts']}")
    out["failures"] = failures
    print(json.dumps(out, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
