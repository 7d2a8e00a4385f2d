"""The series' tiling of an interval range (backend.series._tiling), which takes the inner run of
top-level blocks in one step, against the tile-by-tile walk it replaced, and against the range."""

import random

import pytest

from packscope.backend.reads.series import _tiling


def walk(first: int, last: int, top: int) -> list[tuple[int, int]]:
    """Tile by tile from the left, each the coarsest aligned block (level <= top) that fits."""
    out = []
    at = first
    while at <= last:
        level = top
        while level and (at % 4**level or at + 4**level - 1 > last):
            level -= 1
        out.append((level, at // 4**level))
        at += 4**level
    return out


def grouped(tiles: list[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for level, block in tiles:
        out.setdefault(level, []).append(block)
    return out


def cases() -> list[tuple[int, int, int]]:
    rng = random.Random(8)
    out = [(0, 0, 0), (0, 3, 1), (0, 999_999, 4), (1, 999_998, 4), (5, 5, 3), (0, 4**10 - 1, 10), (17, 4**6, 5)]
    for _ in range(400):
        first = rng.choice([0, rng.randrange(4**5), rng.randrange(4**10)])
        last = first + rng.choice([0, 1, 3, rng.randrange(4**3), rng.randrange(4**7)])
        out.append((first, last, rng.randrange(11)))
    return out


@pytest.mark.parametrize(("first", "last", "top"), cases())
def test_tiling_equals_the_walk(first, last, top):
    tiling = _tiling(first, last, top)
    want = grouped(walk(first, last, top))
    assert list(tiling) == list(want)  # the levels in the order the tiles meet them (the reads' order)
    assert {level: list(blocks) for level, blocks in tiling.items()} == want
    if last - first < 20_000:  # exactly the range, each interval once
        spans = [range(b * 4**level, (b + 1) * 4**level) for level, blocks in tiling.items() for b in blocks]
        assert sorted(i for span in spans for i in span) == list(range(first, last + 1))
    assert all(level == top or len(blocks) <= 6 for level, blocks in tiling.items())
