"""The run file format: what is written reads back, and every malformed line is named."""

from __future__ import annotations

import pytest

from packscope.core.run_file import RunFileError, read_run_file, write_run_file

RUN = {"run_id": "r1", "layout": "thd", "model": {"layers": 2}}
RECORDS = [{"interval": i, "rank": 0, "tokens": 10 * i} for i in range(3)]


def test_round_trip(tmp_path):
    path = write_run_file(tmp_path / "a" / "rank0.jsonl", RUN, RECORDS)
    back = read_run_file(path)
    assert (back.run, back.records) == (RUN, RECORDS)
    assert not list(tmp_path.glob("a/*.tmp"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"run": {"run_id": "r"}}\nnot json\n', ":2: not JSON"),
        ('{"record": {"interval": 0}}\n', ":1: a record before the run line"),
        ('{"run": {}}\n{"run": {}}\n', ":2: the run line must come first, once"),
        ('{"run": {}}\n{"interval": {}}\n', ":2: unknown line kind 'interval'"),
        ('{"run": {}}\n[1, 2]\n', ':2: expected {"run"'),
        ('{"run": {}, "record": {}}\n', ':1: expected {"run"'),
        ("\n\n", "empty: no run line"),
    ],
)
def test_malformed_lines_are_named(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(RunFileError, match=message.replace("(", r"\(").replace("[", r"\[").replace("{", r"\{")):
        read_run_file(path)
