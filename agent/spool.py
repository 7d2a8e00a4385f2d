"""Append-only on-disk spool for records the server could not take yet.

One JSON record per line. Replay reads from the front in order; what was sent is cut off by
rewriting the remainder (the spool is small next to a training run's I/O and only touched by
the sender thread). When the spool would grow past its limit, the oldest records are evicted
and counted, never silently.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("packscope.agent")


class Spool:
    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.evicted = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._count = self._count_lines()  # a spool left by an earlier process is replayed too

    def _count_lines(self) -> int:
        if not self.path.exists():
            return 0
        with self.path.open("rb") as f:
            return sum(1 for _ in f)

    def __len__(self) -> int:
        return self._count

    def append(self, records: list[dict]) -> None:
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        with self.path.open("ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self._count += len(records)
        if self.path.stat().st_size > self.max_bytes:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        lines = self.path.read_bytes().splitlines(keepends=True)
        size = sum(len(x) for x in lines)
        dropped = 0
        while len(lines) > 1 and size > self.max_bytes:  # never drop the newest record
            size -= len(lines.pop(0))
            dropped += 1
        self._rewrite(lines)
        self.evicted += dropped
        log.warning(
            "packscope spool over %d bytes: evicted the %d oldest interval records (%d in total)",
            self.max_bytes, dropped, self.evicted,
        )

    def peek(self, n: int) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        with self.path.open("rb") as f:
            for line in f:
                if len(out) == n:
                    break
                out.append(json.loads(line))
        return out

    def drop_front(self, n: int) -> None:
        lines = self.path.read_bytes().splitlines(keepends=True)
        self._rewrite(lines[n:])

    def _rewrite(self, lines: list[bytes]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(b"".join(lines))
        os.replace(tmp, self.path)
        self._count = len(lines)
