"""`packscope demo`: a server on the embedded SQLite default, fed by the gallery and two live runs.

First the gallery (gallery/README.md): runs recorded on a GPU, packaged as run files, are
imported, so the first screen shows real numbers; before/after pairs (tags `pair:<name>`,
`before`, `after`) get a compare link. Then two live runs train the same tiny model on the same
synthetic documents on the CPU, once padded (BSHD, one document per row) and once packed (THD,
per-document attention), so the dashboard shows the baseline and THD-corrected FLOPs apart, and
what packing does to step time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--database-url", default=None, help="default: the server's (sqlite:///./packscope.db)")
    # The defaults keep the live part under two minutes on a 2-core machine shared with other
    # work, where 120 steps of 4 packs on 2 threads did not (commit 7e105ce gives both times).
    p.add_argument("--steps", type=int, default=60, help="training steps of each live run (default: %(default)s)")
    p.add_argument(
        "--packs-per-step",
        type=int,
        default=2,
        help="token budget per step, in packs of 512 tokens (default: %(default)s)",
    )
    p.add_argument("--log-every", type=int, default=5, help="steps per interval record (default: %(default)s)")
    # One thread: on 2 cores, 2 intra-op threads made these tiny steps 4-10x slower in wall time
    # (and 5x the CPU time) next to the server process; one leaves a core to the server.
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads of the live runs (default: %(default)s)",
    )
    p.add_argument(
        "--exit-when-done", action="store_true", help="stop the server after the runs instead of waiting for Ctrl-C"
    )
    p.add_argument(
        "--gallery",
        default=None,
        metavar="DIR",
        help="import the run files (*.jsonl) in DIR instead of the packaged gallery",
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


def import_gallery(url: str, folder: str | Path | None = None) -> list[str]:
    """Import the gallery's run files into the server at `url`; the lines that say where to look."""
    from packscope import gallery
    from packscope.commands import importer

    paths = gallery.run_files(folder)
    where = f"in {folder}" if folder is not None else "packaged"
    if not paths:
        print(f"No gallery run files are {where} (gallery/README.md says how they are made); live runs only.")
        return []
    files, errors = importer.load_run_files(paths)
    for message in errors:
        print(f"packscope demo: gallery file skipped: {message}", file=sys.stderr)
    for message in (line for f in files for line in f.bad_lines):
        print(f"packscope demo: gallery line skipped: {message}", file=sys.stderr)
    client = importer.Client(url, os.environ.get(importer.TOKEN_ENV))
    results = importer.import_runs(files, client, say=lambda line: None)
    for failed in (r for r in results if not r.ok):
        print(f"packscope demo: gallery run {failed.run_id} not imported: {failed.error}", file=sys.stderr)
    imported = [r for r in results if r.ok]
    records = sum(f.accepted + f.duplicates for r in imported for f in r.files)
    print(f"Gallery: {len(imported)} runs ({records} interval records) imported from {len(paths)} run files {where}")
    return gallery_links(url, [r.run for r in imported]) if imported else []


def gallery_links(url: str, runs: list[dict[str, Any]]) -> list[str]:
    """The runs page of the gallery, and a compare page per before/after pair: runs tagged
    `pair:<name>` and `before` or `after`, the befores first (the compare page's reference)."""
    projects = {run.get("project") for run in runs}
    project = projects.pop() if len(projects) == 1 else None
    query = f"?{urllib.parse.urlencode({'project': project})}" if isinstance(project, str) and project else ""
    lines = [f"Gallery:   {url}/{query}"]
    pairs: dict[str, dict[str, list[str]]] = {}
    for run in runs:
        tags = [t for t in run.get("tags") or [] if isinstance(t, str)]
        roles = [t for t in tags if t in ("before", "after")]
        for tag in tags:
            if tag.startswith("pair:") and len(roles) == 1:
                pairs.setdefault(tag.removeprefix("pair:"), {"before": [], "after": []})[roles[0]].append(run["run_id"])
    for name, sides in sorted(pairs.items()):
        if sides["before"] and sides["after"]:
            ids = urllib.parse.urlencode([("run_id", r) for r in sides["before"] + sides["after"]])
            lines.append(f"  {name}: {url}/compare?{ids}")
    return lines


def live_configs(args: argparse.Namespace, url: str) -> list[Any]:
    """The two live runs: the same tiny model and documents, padded (BSHD), then packed (THD).
    Their ids are made here, so that their pages can be linked before they start."""
    from packscope.agent.agent import make_run_id
    from packscope.trainer.config import TrainConfig

    common = dict(steps=args.steps, packs_per_step=args.packs_per_step, log_every=args.log_every, server=url)
    return [
        TrainConfig(
            layout=layout, name=f"demo-{layout}", project="demo", run_id=make_run_id(f"demo-{layout}"), **common
        )
        for layout in ("bshd", "thd")
    ]


def live_links(url: str, configs: list[Any]) -> list[str]:
    """Where to watch the live runs: each run's page, and both compared."""
    lines = [f"  {cfg.layout}: {url}/runs/{urllib.parse.quote(cfg.run_id, safe='')}" for cfg in configs]
    compare = urllib.parse.urlencode([("run_id", cfg.run_id) for cfg in configs])
    return [*lines, f"Live:      {url}/compare?{compare}"]


def _end_with_the_demo() -> None:
    """In the server's process, before it runs: on Linux, be sent SIGTERM when the demo dies, even
    by kill -9, so that no server is left serving after it."""
    if sys.platform != "linux":
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop_on_signals() -> None:
    """SIGTERM ends the demo as Ctrl-C does: through the `finally` that stops the server (the default
    action would end this process alone and leave the server serving). Ctrl-C itself too, also when
    the demo was started with SIGINT ignored (a background job of a script), where Python would
    not raise KeyboardInterrupt."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def demo_from_args(args: argparse.Namespace) -> int:
    url = f"http://{args.host}:{args.port}"
    if args.gallery is not None and not Path(args.gallery).is_dir():
        print(f"packscope demo: error: --gallery {args.gallery}: not a folder", file=sys.stderr)
        return 2
    try:
        if args.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {args.threads}")
        configs = live_configs(args, url)
    except ValueError as err:
        print(f"packscope demo: error: {err}", file=sys.stderr)
        return 2
    if _port_taken(args.host, args.port):
        print(f"packscope demo: error: {url} is already in use; stop what runs there or pass --port", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "packscope", "serve", "--host", args.host, "--port", str(args.port), "--no-access-log"]
    if args.database_url:
        cmd += ["--database-url", args.database_url]
    _stop_on_signals()
    server = subprocess.Popen(cmd, preexec_fn=_end_with_the_demo)
    try:
        _wait_for_server(url, server)
        print(f"packscope server up at {url}")
        gallery = import_gallery(url, args.gallery)
        if gallery:
            print("\n".join(gallery))
        links = live_links(url, configs)
        print("Training two live reference runs on the CPU, on the same documents (BSHD, then THD); watch them:")
        print("\n".join(links), flush=True)

        import torch

        from packscope.trainer.train import run_training

        torch.set_num_threads(args.threads)
        live_start = time.monotonic()
        for cfg in configs:
            summary = run_training(cfg)
            loss = f"loss {summary['first_loss']:.3f} -> {summary['final_loss']:.3f}"
            print(f"  {cfg.layout}: {loss} in {summary['seconds']:.0f} s  {url}/runs/{summary['run_id']}")
        print(f"Live runs took {time.monotonic() - live_start:.0f} s")
        print("\n".join([f"\nDashboard: {url}/", *gallery, links[-1]]))
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
