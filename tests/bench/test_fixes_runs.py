"""bench/fixes_runs.py --rounds records each pair before and after in turn (B A B A), each run's
file named and tagged by its round, so the ground-truth test (tests/backend/test_gallery_ledger.py)
can take the rounds' medians. A dry run on the CPU (the tiny preset)."""

import subprocess
import sys
from pathlib import Path

from packscope.core.run_file import read_run_file

BENCH = Path(__file__).parents[2] / "bench" / "fixes_runs.py"


def test_rounds_alternate_before_and_after_and_name_their_files(tmp_path):
    gallery = tmp_path / "gallery"
    gallery.mkdir()
    shape = ["--presets", "tiny", "--steps", "4", "--log-every", "2", "--pack-length", "128"]
    command = [
        sys.executable,
        str(BENCH),
        "padding",
        "--device",
        "cpu",
        *shape,
        "--rounds",
        "2",
        "--gallery",
        str(gallery),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    runs = {p.name: read_run_file(p) for p in gallery.glob("*.jsonl")}
    files = {name: run.run for name, run in runs.items()}
    assert sorted(files) == [f"padding-tiny-r{k}-{role}.jsonl" for k in (1, 2) for role in ("after", "before")]
    for name, run in files.items():
        k, role = name.removesuffix(".jsonl").split("-")[-2:]
        assert {"pair:padding-tiny", role, f"round:{k[1:]}", "removes:padding"} <= set(run["tags"])
        assert run["name"].endswith(f"({role}, round {k[1:]})")
    # In turn: each round's before, then its after, then the next round's.
    started = sorted(runs, key=lambda name: runs[name].records[0]["wall_start"])
    order = [(n.split("-")[-2], n.split("-")[-1].removesuffix(".jsonl")) for n in started]
    assert order == [("r1", "before"), ("r1", "after"), ("r2", "before"), ("r2", "after")]


def test_rounds_below_one_are_refused():
    answer = subprocess.run([sys.executable, str(BENCH), "padding", "--rounds", "0"], capture_output=True, text=True)
    assert answer.returncode == 2 and "--rounds must be at least 1" in answer.stderr
