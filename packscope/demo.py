"""`packscope demo`: a server on the embedded SQLite default, fed by two reference runs.

The two runs train the same tiny model on the same synthetic documents, once padded (BSHD,
one document per row) and once packed (THD, per-document attention), so the dashboard shows
the baseline and THD-corrected FLOPs apart, and what packing does to step time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--database-url", default=None, help="default: the server's (sqlite:///./packscope.db)")
    p.add_argument("--steps", type=int, default=120, help="training steps of each run (default 120)")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument(
        "--exit-when-done", action="store_true", help="stop the server after the runs instead of waiting for Ctrl-C"
    )


def _wait_for_server(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it answered (port in use?)")
        try:
            with urllib.request.urlopen(f"{url}/api/v1/runs", timeout=2) as resp:
                json.loads(resp.read())
                return
        except (urllib.error.URLError, OSError, ValueError):
            time.sleep(0.3)
    raise RuntimeError(f"the server did not answer at {url} within {timeout_s:.0f} s")


def _port_taken(host: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def demo_from_args(args: argparse.Namespace) -> int:
    url = f"http://{args.host}:{args.port}"
    if _port_taken(args.host, args.port):
        print(f"packscope demo: error: {url} is already in use; stop what runs there or pass --port", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "packscope", "serve", "--host", args.host, "--port", str(args.port), "--no-access-log"]
    if args.database_url:
        cmd += ["--database-url", args.database_url]
    server = subprocess.Popen(cmd)
    try:
        _wait_for_server(url, server)
        print(f"packscope server up at {url}; training two reference runs on the same documents")

        from packscope.trainer.config import TrainConfig
        from packscope.trainer.train import run_training

        run_ids = []
        for layout in ("bshd", "thd"):
            cfg = TrainConfig(
                layout=layout,
                steps=args.steps,
                log_every=args.log_every,
                server=url,
                name=f"demo-{layout}",
                project="demo",
            )
            summary = run_training(cfg)
            run_ids.append(summary["run_id"])
            loss = f"loss {summary['first_loss']:.3f} -> {summary['final_loss']:.3f}"
            print(f"  {layout}: {loss}  {url}/runs/{summary['run_id']}")
        compare = "&".join(f"run_id={r}" for r in run_ids)
        print(f"\nDashboard: {url}/\nCompare:   {url}/compare?{compare}")
        if args.exit_when_done:
            return 0
        print("The server stays up; press Ctrl-C to stop it.")
        server.wait()
        return server.returncode or 0
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:
        print(f"packscope demo: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
