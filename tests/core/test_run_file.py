"""The run file format: what is written reads back, and every malformed line is named."""

from __future__ import annotations

import re

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
        ("not json\n", ":1: not JSON"),
        (b'\xff{"run": {}}\n', ":1: not UTF-8 text (byte 0)"),
        ('{"record": {"interval": 0}}\n', ":1: the first line must be the run line, not 'record'"),
        ('[1, 2]\n{"run": {}}\n', ':1: expected {"run"'),
        ('{"run": {}, "record": {}}\n', ':1: expected {"run"'),
        ("\n\n", "empty: no run line"),
    ],
)
def test_a_file_without_a_run_line_first_is_not_a_run_file(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(RunFileError, match=re.escape(message)):
        read_run_file(path)


def test_damaged_record_lines_are_skipped_and_named_and_the_others_read(tmp_path):
    """A torn or garbage line spoils only itself: every good record reads, in order, with its line."""
    path = write_run_file(tmp_path / "rank0.jsonl", RUN, [{"interval": i, "rank": 0} for i in range(8)])
    lines = path.read_bytes().split(b"\n")  # line 1: the run; line k + 2: interval k
    lines[2] = b"\x00\xff garbage \xfe"  # interval 1
    lines[3] = lines[3][:10]  # interval 2, cut short
    lines[4] = b'{"run": {"run_id": "r2"}}'  # interval 3: a second run line
    lines[5] = b'{"record": {"interval": "4", "rank": 0}}'
    lines[6] = b'{"recrod": {"interval": 5}}'
    path.write_bytes(b"\n".join(lines[:-1])[:-5])  # interval 7 torn: the file ends mid-line
    back = read_run_file(path)
    assert [r["interval"] for r in back.records] == [0, 6]
    assert back.record_lines == [2, 8]
    assert back.bad_lines == [
        f"{path}:3: not UTF-8 text (byte 1)",
        f"{path}:4: not JSON (Expecting value)",
        f"{path}:5: a second run line (the run line comes first, once)",
        f"{path}:6: a record needs an integer 'interval', got '4'",
        f'{path}:7: unknown line kind \'recrod\' (expected "run" or "record")',
        f"{path}:9: not JSON (Expecting ':' delimiter); the file ends mid-line (a torn write?)",
    ]
