"""`packscope demo` imports the gallery's run files before its live runs and says where to look:
the gallery's runs page and a compare page per before/after pair. The gallery here is a
temporary folder of run files from a real (tiny, CPU) training, passed with --gallery."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli.support import clean_env, derived, free_port, get, running_server
from packscope import gallery
from packscope.commands import importer
from packscope.commands.demo import gallery_links, import_gallery
from packscope.core.run_file import read_run_file

URL = "http://127.0.0.1:8000"


def tagged(pair: str, role: str) -> dict:
    return {"project": "gallery", "tags": ["gallery", f"pair:{pair}", role, "H200"]}


@pytest.mark.slow
def test_the_demo_imports_the_gallery_before_its_live_runs(trained, tmp_path):
    folder = tmp_path / "gallery"
    folder.mkdir()
    before = derived(
        trained["bshd"], folder / "packing-before.jsonl", "gallery-packing-before", **tagged("packing", "before")
    )
    after = derived(
        trained["thd"], folder / "packing-after.jsonl", "gallery-packing-after", **tagged("packing", "after")
    )
    (folder / "README.md").write_text("not a run file\n")
    db = tmp_path / "demo.db"
    port = free_port()
    command = [sys.executable, "-m", "packscope", "demo", "--port", str(port), "--database-url", f"sqlite:///{db}"]
    command += ["--gallery", str(folder), "--steps", "2", "--log-every", "1", "--exit-when-done"]
    env = clean_env(OMP_NUM_THREADS="1")  # HOME: the test's own (tests/conftest.py)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    base = f"http://127.0.0.1:{port}"
    assert f"Gallery: 2 runs (24 interval records) imported from 2 run files in {folder}" in out
    assert out.index("Gallery:") < out.index("Training two live reference runs")
    assert f"Gallery:   {base}/?project=gallery" in out
    assert f"  packing: {base}/compare?run_id=gallery-packing-before&run_id=gallery-packing-after" in out
    with running_server(db) as server:
        for path in (before, after):
            run_file = read_run_file(path)
            summary = get(server, f"/api/v1/runs/{run_file.run['run_id']}")
            assert summary["status"] == "finished" and summary["records"] == len(run_file.records)
            assert summary["totals"]["real_tokens"] == sum(r["real_tokens"] for r in run_file.records)
            assert summary["tags"] == run_file.run["tags"]
        live = get(server, "/api/v1/runs?project=demo")["runs"]
        assert sorted(r["layout"] for r in live) == ["bshd", "thd"]
        assert all(r["status"] == "finished" and r["records"] == 2 for r in live)


def test_pairs_become_compare_links_befores_first():
    runs = [
        {"run_id": "a2", "project": "gallery", "tags": ["pair:logging", "after"]},
        {"run_id": "b1", "project": "gallery", "tags": ["pair:logging", "before"]},
        {"run_id": "c1", "project": "gallery", "tags": ["pair:graphs", "before"]},  # no after: no link
        {"run_id": "d1", "project": "gallery", "tags": ["gallery"]},
        {"run_id": "e1", "project": "gallery", "tags": ["pair:mfu", "before"]},
        {"run_id": "e2", "project": "gallery", "tags": ["pair:mfu", "after"]},
        {"run_id": "e3", "project": "gallery", "tags": ["pair:mfu", "after"]},
    ]
    assert gallery_links(URL, runs) == [
        f"Gallery:   {URL}/?project=gallery",
        f"  logging: {URL}/compare?run_id=b1&run_id=a2",
        f"  mfu: {URL}/compare?run_id=e1&run_id=e2&run_id=e3",
    ]


def test_runs_of_several_projects_link_the_whole_runs_page():
    runs = [{"run_id": "a", "project": "p", "tags": []}, {"run_id": "b", "project": "q", "tags": []}]
    assert gallery_links(URL, runs) == [f"Gallery:   {URL}/"]


def test_no_gallery_files_says_so_and_sends_nothing(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert import_gallery("http://127.0.0.1:9", tmp_path) == []  # nothing listens there: nothing was sent
    assert f"No gallery run files are in {tmp_path}" in capsys.readouterr().out


def test_the_listing_takes_run_files_only(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.json", "rank0.jsonl.tmp"):
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "d.jsonl").mkdir()
    assert gallery.run_files(tmp_path) == [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]


def test_the_packaged_listing_is_the_packages_folder():
    folder = Path(gallery.__file__).parent
    assert gallery.run_files() == sorted(folder.glob("*.jsonl"))
    assert (folder / "README.md").is_file()  # what the files are and how to add some


def test_the_packaged_gallery_imports_whole_and_pairs_up(server):
    """Every packaged run file reads, the server takes every record, and every pair has both sides."""
    files, errors = importer.load_run_files(gallery.run_files())
    assert files and not errors
    results = importer.import_runs(files, importer.Client(server), say=lambda line: None)
    assert [r.error for r in results if not r.ok] == []
    for result in results:
        assert [(f.accepted + f.duplicates, f.records) for f in result.files] == [
            (f.records, f.records) for f in result.files
        ]
        records = [r for f in files if f.run_id == result.run_id for r in f.run_file.records]
        summary = get(server, f"/api/v1/runs/{result.run_id}")
        assert summary["records"] == len(records) and summary["status"] == "finished"
        assert summary["totals"]["real_tokens"] == sum(r["real_tokens"] for r in records)
    pairs = {t for r in results for t in r.run["tags"] if t.startswith("pair:")}
    links = gallery_links(URL, [r.run for r in results])
    assert sorted(line.split(":")[0].strip() for line in links[1:]) == sorted(p.removeprefix("pair:") for p in pairs)
