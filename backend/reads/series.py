"""The series of a run (GET /api/v1/runs/{id}/series): consecutive intervals grouped into at most
max_points buckets, read from the rollups kept at ingest (about max_points rows whatever the run's
length), level 0 grouped from the interval rows; every derived number from the catalogue's formulas
(backend.columns on numpy columns)."""

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import bindparam, func, literal, select
from sqlalchemy.orm import Session

from packscope.backend.formulas.columns import (
    BAND_COLUMNS,
    BLOCK_FLOAT_COLUMNS,
    BLOCK_INT_COLUMNS,
    WALL_COLUMNS,
    derive_columns,
    listed,
    merge_blocks,
    merged_by,
)
from packscope.backend.formulas.sums_read import sums_read
from packscope.backend.store.aggregates import READ_COLUMNS, channel_parts, level_0_blocks
from packscope.backend.store.models import ROLLUP_LEVELS, Run, intervals, rollups, run_totals
from packscope.backend.store.runs import coefficients
from packscope.core.catalogue import METRIC, SUM_NAMES

# -- series ---------------------------------------------------------------------------------------
# The small statements of every series request, built once (their construction cost more than
# their execution): parameters `run_pk`, `step`, `first`, `last`, `limit`.
_LAST_INTERVAL = select(run_totals.c.last_interval).where(run_totals.c.run_pk == bindparam("run_pk"))
_FIRST_INTERVAL = (
    select(intervals.c.interval)
    .where(intervals.c.run_pk == bindparam("run_pk"))
    .order_by(intervals.c.interval)
    .limit(1)
)
# The first interval that ends at or after a step.
_ENDING_FROM = (
    select(intervals.c.interval, intervals.c.first_step)
    .where(intervals.c.run_pk == bindparam("run_pk"), intervals.c.last_step >= bindparam("step"))
    .order_by(intervals.c.last_step)
    .limit(1)
)


def _interval_range(session: Session, run: Run, step_min: int | None, step_max: int | None) -> tuple[int, int] | None:
    """The interval indexes [first, last] whose steps meet [step_min, step_max]; None if none do.

    Steps grow with the interval index, so the range is found on the (run_pk, last_step) index:
    the first interval ending at or after step_min, the last one starting at or before step_max.
    """
    last = session.scalar(_LAST_INTERVAL, {"run_pk": run.id})
    first = session.scalar(_FIRST_INTERVAL, {"run_pk": run.id})
    if last is None or first is None:
        return None
    if step_min is not None:
        found = session.execute(_ENDING_FROM, {"run_pk": run.id, "step": step_min}).first()
        if found is None:
            return None
        first = max(first, found.interval)
    if step_max is not None:
        found = session.execute(_ENDING_FROM, {"run_pk": run.id, "step": step_max}).first()
        if found is not None:
            last = min(last, found.interval if found.first_step <= step_max else found.interval - 1)
    return (first, last) if first <= last else None


def _chart_level(first: int, last: int, max_points: int) -> int:
    """The coarsest rollup level that still has at least max_points blocks over [first, last]."""
    chosen = 0
    for level in ROLLUP_LEVELS:
        if (last >> 2 * level) - (first >> 2 * level) + 1 < max_points:
            break
        chosen = level
    return chosen


# Level 0 is grouped from the interval rows (one per rank), so a chart at level 0 reads
# intervals x ranks rows. Up to this many per point it does: as many bytes as the stored level 0
# cost before 0007 (4·max_points rows of 34 columns), so a run of 1 or 2 ranks keeps one point
# per interval at every zoom; past it (more ranks, over more than 8·max_points/ranks intervals)
# the chart is drawn from level-1 blocks: exact still, 4 intervals a point at most.
LEVEL_0_ROWS_PER_POINT = 8


_ROWS_UP_TO = select(func.count()).select_from(
    select(literal(1))
    .where(intervals.c.run_pk == bindparam("run_pk"), intervals.c.interval.in_(bindparam("chosen", expanding=True)))
    .limit(bindparam("limit"))
    .subquery()
)


def _more_rows_than(session: Session, run: Run, first: int, last: int, limit: int) -> bool:
    """Does the run hold more than `limit` interval rows in [first, last]? Counted from the
    rollups' `rows` of the blocks that tile the range (one row per level's blocks, whatever the
    run's ranks), and the interval rows of the level-0 tiles (at most 3 intervals at each end)
    only where the blocks hold `limit` or fewer, reading at most limit + 1. Not a LIMIT count of
    the range's interval rows: its reads grew with the ranks up to limit + 1 rows, and on
    PostgreSQL a plan made without statistics (a bitmap scan, which cannot stop at the LIMIT)
    read every index entry of the run first (its cost at 16,384 ranks:
    docs/benchmarks/2026-12-06-2core-ranks.md#dev-2026-12-06-series-flat)."""
    tiling = _tiling(first, last, ROLLUP_LEVELS[-1])
    stored = 0
    if any(level > 0 for level in tiling):
        selects, params = _tile_selects(run, "rollups", '"rows"', tiling, ROLLUP_LEVELS[-1])
        driver, postgresql = _driver(session)
        sql = f'SELECT COALESCE(SUM("rows"), 0) FROM ({" UNION ALL ".join(selects)}) AS tiles'
        stored = int(driver.execute(sql.replace("?", "%s") if postgresql else sql, params).fetchone()[0])
    if stored > limit or 0 not in tiling:
        return stored > limit
    wanted = {"run_pk": run.id, "chosen": list(tiling[0]), "limit": limit - stored + 1}
    return stored + (session.scalar(_ROWS_UP_TO, wanted) or 0) > limit


Tiling = dict[int, Sequence[int]]  # level -> its blocks, in the order the tiles meet them


def _tiling(first: int, last: int, top: int) -> Tiling:
    """Aligned blocks, none coarser than `top`, that tile [first, last] exactly, by level (levels
    in the order the tiles meet them, blocks ascending): level-`top` blocks inside, one contiguous
    range, finer ones (at most 3 per level) at each partial edge. The tiles are found from the left,
    each the coarsest aligned block that fits; the inner run of level-`top` blocks is taken in one
    step, so this costs O(levels), not O(blocks)."""
    out: dict[int, Any] = {}
    at = first
    while at <= last:
        level = top
        while level and (at % (1 << 2 * level) or at + (1 << 2 * level) - 1 > last):
            level -= 1
        if level == top:  # every following tile is a level-`top` block while one fits
            n = (last + 1 - at) >> 2 * top
            out[top] = range(at >> 2 * top, (at >> 2 * top) + n)
            at += n << 2 * top
        else:
            out.setdefault(level, []).append(at >> 2 * level)
            at += 1 << 2 * level
    return out


def _driver(session: Session) -> tuple[Any, bool]:
    """The DB-API connection under the session's transaction, and whether it is PostgreSQL's
    (placeholders %s rather than ?)."""
    return session.connection().connection.driver_connection, session.get_bind().dialect.name == "postgresql"


def _tile_selects(run: Run, table: str, columns: str, tiling: Tiling, top: int) -> tuple[list[str], list[Any]]:
    """One SELECT of `columns` (which may use `level` and `block`) per tiling level ≥ 1 of `table`,
    with their parameters: a range on the primary key for the level-`top` blocks (contiguous), an
    IN list for each finer level's edge blocks (at most 3 per end)."""
    selects, params = [], []
    for level, blocks in tiling.items():
        if level == 0:
            continue
        if level == top:
            chosen, values = "BETWEEN ? AND ?", [blocks[0], blocks[-1]]
        else:
            chosen, values = f"IN ({', '.join('?' * len(blocks))})", list(blocks)
        selects.append(f"SELECT {columns} FROM {table} WHERE run_pk = ? AND level = ? AND block {chosen}")
        params += [run.id, level, *values]
    return selects, params


def _tile_rows(session: Session, run: Run, table: str, columns: str, tiling: Tiling, top: int) -> list[tuple[Any, ...]]:
    """`level, block, columns` of `table`'s rows of the tiles (level ≥ 1): one SELECT per level,
    joined by UNION ALL, so each is a range or IN lookup on the primary key (an OR across levels
    lets SQLite scan every block of the run instead). Read from the driver's own cursor as plain
    tuples: SQLAlchemy's Row objects cost as much as the fetch, and a few thousand of them alive
    at once were promoted to the collector's oldest generation, whose full collections
    (docs/benchmarks/2026-11-30-2core.md, "The series' tail") came every few series. PostgreSQL's
    rows come in binary (psycopg's binary cursor: a float is its 8 bytes, the same value as its
    text, a third of the time)."""
    selects, params = _tile_selects(run, table, f"level, block, {columns}", tiling, top)
    sql = " UNION ALL ".join(selects)
    driver, postgresql = _driver(session)
    if postgresql:
        with driver.cursor(binary=True) as cursor:
            return cursor.execute(sql.replace("?", "%s"), params).fetchall()
    return driver.execute(sql, params).fetchall()


_BLOCK_COLUMNS = ", ".join(f'"{name}"' for name in (*BLOCK_INT_COLUMNS, *BLOCK_FLOAT_COLUMNS))


def _stored_blocks(session: Session, run: Run, tiling: Tiling, top: int) -> np.ndarray:
    """(level, block, BLOCK_INT_COLUMNS, BLOCK_FLOAT_COLUMNS) rows, as floats (NULL -> NaN), of the
    stored rollup tiles (level ≥ 1)."""
    rows = _tile_rows(session, run, "rollups", _BLOCK_COLUMNS, tiling, top)
    return np.array(rows, dtype=float).reshape(len(rows), 2 + len(BLOCK_INT_COLUMNS) + len(BLOCK_FLOAT_COLUMNS))


_READ_SQL = (
    f"SELECT {', '.join(READ_COLUMNS)}, channel_loss, channel_tokens FROM intervals WHERE run_pk = ? AND interval "
)
_NUMBERS = len(READ_COLUMNS)
ChannelParts = tuple[np.ndarray, list[str], np.ndarray, np.ndarray]  # aggregates.channel_parts


def _interval_blocks(
    session: Session, run: Run, blocks: Sequence[int], contiguous: bool
) -> tuple[np.ndarray, ChannelParts | None]:
    """Level-0 tiles (one interval merged over its ranks), which are not stored: grouped from the
    interval rows with ingest's own arithmetic (aggregates.level_0_blocks), rows as _stored_blocks',
    and their channels' (interval, channel, loss_sum, tokens) parts (aggregates.channel_parts).
    Bounded by the tiling: the whole range only when it spans fewer than 4·max_points intervals
    (and at most LEVEL_0_ROWS_PER_POINT rows per point), else at most 3 intervals at each end.
    The rows come from the driver's own cursor, as plain tuples (up to 8 per point: SQLAlchemy's
    Row objects cost as much as the fetch)."""
    chosen = "BETWEEN ? AND ?" if contiguous else f"IN ({', '.join('?' * len(blocks))})"
    params = (run.id, blocks[0], blocks[-1]) if contiguous else (run.id, *blocks)
    sql = f"{_READ_SQL}{chosen} ORDER BY interval"
    driver, postgresql = _driver(session)
    if postgresql:
        sql = sql.replace("?", "%s")
    rows = driver.execute(sql, params).fetchall()
    if not rows:
        return np.empty((0, 2 + len(BLOCK_INT_COLUMNS) + len(BLOCK_FLOAT_COLUMNS))), None
    found, columns = level_0_blocks([row[:_NUMBERS] for row in rows], coefficients(run))
    channels = channel_parts((row[0], row[-2], row[-1]) for row in rows if row[-1] is not None)
    return np.column_stack([np.zeros(len(found)), found, columns]), channels


def _read_tiles(session: Session, run: Run, tiling: Tiling, top: int) -> tuple[np.ndarray, ChannelParts | None]:
    """The rollup rows of the tiles that hold intervals, in tile order, as _stored_blocks' rows:
    level ≥ 1 as stored, level 0 grouped from the interval rows (with its channel parts)."""
    by_level = dict(tiling)
    parts = []
    channels = None
    if 0 in by_level:
        level_0, channels = _interval_blocks(session, run, by_level.pop(0), top == 0)
        parts.append(level_0)
    if by_level:
        parts.append(_stored_blocks(session, run, by_level, top))
    found = np.concatenate(parts) if len(parts) > 1 else parts[0]
    first_interval = found[:, 1].astype(np.int64) << (2 * found[:, 0].astype(np.int64))
    return found[np.argsort(first_interval, kind="stable")], channels  # tiles are disjoint: by start


class _Buckets:
    """How a range's tiles are dealt into a chart's buckets: by their part (the level-`top` block
    they lie in), the parts that hold rows, in order, into at most max_points buckets of
    consecutive parts, as evenly as whole parts allow: bucket b starts at the part of rank
    b·count // points, so the part of rank r (from 0) is in bucket ((r + 1)·points - 1) // count."""

    def __init__(self, parts: np.ndarray, top: int, max_points: int) -> None:
        self.parts = parts  # the parts that hold rows: ascending, distinct
        self.top = top
        self.count = len(parts)
        self.points = min(self.count, max_points)

    def of(self, levels: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """The bucket of each tile (level, block); -1 for one outside the parts."""
        part = (blocks << 2 * levels) >> 2 * self.top
        rank = np.searchsorted(self.parts, part)
        inside = rank < self.count
        inside[inside] = self.parts[rank[inside]] == part[inside]
        return np.where(inside, ((rank + 1) * self.points - 1) // max(self.count, 1), -1)


def _channel_series(
    session: Session,
    run: Run,
    tiling: Tiling,
    top: int,
    buckets: _Buckets,
    level_0: ChannelParts | None,
) -> tuple[dict[str, list[float | None]], dict[str, list[float]]]:
    """Per channel, each bucket's Σloss_sum / Σtokens (None where the channel has no tokens in
    it) and Σtokens, from the channel rollups of the same tiles the series read (level ≥ 1) and
    the level-0 tiles' interval rows."""
    found: list[tuple[Any, ...]] = []
    if any(level > 0 for level in tiling):
        found = _tile_rows(
            session, run, "channel_rollups", "channel, loss_sum, tokens", {k: v for k, v in tiling.items() if k}, top
        )
    if level_0 is not None:
        intervals_0, names_0, loss_sums_0, tokens_0 = level_0
        found += zip(
            [0] * len(names_0), intervals_0.tolist(), names_0, loss_sums_0.tolist(), tokens_0.tolist(), strict=True
        )
    if not found:
        return {}, {}
    levels, blocks, channel_of, loss_sum_of, tokens_of = zip(*found, strict=True)
    at_bucket = buckets.of(np.array(levels, dtype=np.int64), np.array(blocks, dtype=np.int64)).tolist()
    loss_sums: dict[str, np.ndarray] = {}
    tokens: dict[str, np.ndarray] = {}
    for at, channel, loss_sum, n in zip(at_bucket, channel_of, loss_sum_of, tokens_of, strict=True):
        if at < 0:
            continue
        if channel not in tokens:
            loss_sums[channel], tokens[channel] = np.zeros(buckets.points), np.zeros(buckets.points)
        loss_sums[channel][at] += loss_sum
        tokens[channel][at] += n
    names = sorted(tokens)
    with np.errstate(invalid="ignore", divide="ignore"):
        losses = {name: listed(np.where(tokens[name] > 0, loss_sums[name] / tokens[name], np.nan)) for name in names}
    return losses, {name: tokens[name].tolist() for name in names}


_WALL_ORIGIN = select(func.min(rollups.c.wall_start_min)).where(
    rollups.c.run_pk == bindparam("run_pk"), rollups.c.level == ROLLUP_LEVELS[-1]
)


def wall_origin(session: Session, run: Run) -> float | None:
    """Unix time of the run's first interval start: the earliest start of its top-level blocks
    (one block per 4^10 intervals, so a handful of rows)."""
    found = session.scalar(_WALL_ORIGIN, {"run_pk": run.id})
    return None if found is None else float(found)


def _aggregate(name: str) -> str:
    """The SQL that merges a block column over the blocks of a bucket, as merge_blocks does."""
    how = merged_by(name)
    if how != "sum":
        return f'{how.upper()}("{name}")'
    return f'CAST(SUM("{name}") AS BIGINT)' if name in BLOCK_INT_COLUMNS else f'SUM("{name}")'


@functools.lru_cache(maxsize=64)
def _merged_columns(read: frozenset[str]) -> tuple[np.ndarray, str, str]:
    """The block columns _grouped_read asks the database to merge when the run's formulas read
    the sums `read` (formulas/sums_read.py): the int columns, those sums, the bands and the wall-clock
    extent. (Where each of its float columns sits in BLOCK_FLOAT_COLUMNS, the tiles' select list,
    the merged select list.) A sum no formula reads is not merged: its column comes back NaN."""
    at = [i for i, name in enumerate(BLOCK_FLOAT_COLUMNS) if name not in SUM_NAMES or name in read]
    names = (*BLOCK_INT_COLUMNS, *(BLOCK_FLOAT_COLUMNS[i] for i in at))
    return np.array(at), ", ".join(f'"{name}"' for name in names), ", ".join(_aggregate(name) for name in names)


def _grouped_read(
    session: Session, run: Run, span: tuple[int, int], tiling: Tiling, top: int, max_points: int
) -> tuple[_Buckets, np.ndarray, np.ndarray, np.ndarray, ChannelParts | None] | None:
    """The tiles merged per bucket, when every part of the range holds rows (a run without gaps,
    the usual case): (the buckets, each bucket's key, int columns and float columns, the level-0
    tiles' channel parts). The stored tiles (level ≥ 1) are merged by the database, which hands
    over one row per bucket instead of one per tile (a 1M-interval run: 1,000 rows instead of
    3,907; the drivers' hand-over of each cell was most of a series' time). None where a part holds no
    rows (the buckets are then dealt over the parts that do: _per_tile_read), or where
    PostgreSQL's float8 sum of the blocks overflows (it raises where numpy gives inf)."""
    first, last = span
    if top == 0:
        return None
    p0, p_last = first >> 2 * top, last >> 2 * top
    buckets = _Buckets(np.arange(p0, p_last + 1), top, max_points)
    float_at, block_columns, merged_columns = _merged_columns(sums_read(coefficients(run)))
    part = f"(CAST(block AS BIGINT) << (2 * level)) >> {2 * top} AS part"
    selects, params = _tile_selects(run, "rollups", f"{part}, {block_columns}", tiling, top)
    sql = (
        f"SELECT ((part - {p0} + 1) * {buckets.points} - 1) / {buckets.count} AS bucket, MIN(part), MAX(part), "
        f"{merged_columns} FROM ({' UNION ALL '.join(selects)}) AS tiles GROUP BY bucket ORDER BY bucket"
    )
    inner = tiling.get(top)
    driver, postgresql = _driver(session)
    # Which parts hold rows: first the inner ones (one level-`top` tile each), by an index-only
    # count, before anything is read; then the cut ones at the ends (finer tiles), from the
    # merged rows' part extents and level 0.
    if inner:
        count_sql = _INNER_COUNT.replace("?", "%s") if postgresql else _INNER_COUNT
        if driver.execute(count_sql, (run.id, top, inner[0], inner[-1])).fetchone()[0] != len(inner):
            return None
    rows: list[tuple[Any, ...]] = []
    if postgresql and selects:
        try:
            with driver.transaction(), driver.cursor(binary=True) as cursor:  # a savepoint
                rows = cursor.execute(sql.replace("?", "%s"), params).fetchall()
        except psycopg.errors.NumericValueOutOfRange:
            return None
    elif selects:
        rows = driver.execute(sql, params).fetchall()
    lead = 3 + len(BLOCK_INT_COLUMNS)  # bucket, part extent, int columns
    found = np.array(rows, dtype=float).reshape(len(rows), lead + len(float_at))
    merged = np.full((len(rows), lead + len(BLOCK_FLOAT_COLUMNS)), np.nan)  # the sums not merged: NaN, never read
    merged[:, :lead] = found[:, :lead]
    merged[:, lead + float_at] = found[:, lead:]
    level_0, channels_0 = (
        _interval_blocks(session, run, tiling[0], False) if 0 in tiling else (np.empty((0, merged.shape[1] - 1)), None)
    )
    parts_0 = set((level_0[:, 1].astype(np.int64) >> 2 * top).tolist())
    for end, extent, at in ((p0, 1, 0), (p_last, 2, -1)):
        if (inner and inner[0] <= end <= inner[-1]) or (end == p_last and p_last == p0):
            continue  # an inner part (counted), or the one part already seen
        if not ((len(merged) and merged[at, extent] == end) or end in parts_0):
            return None  # an end part without rows (a step_max inside a gap)
    keys = np.concatenate([merged[:, 0], buckets.of(np.zeros(len(level_0), np.int64), level_0[:, 1].astype(np.int64))])
    ints = np.concatenate([merged[:, 3 : 3 + len(BLOCK_INT_COLUMNS)], level_0[:, 2 : 2 + len(BLOCK_INT_COLUMNS)]])
    floats = np.concatenate([merged[:, 3 + len(BLOCK_INT_COLUMNS) :], level_0[:, 2 + len(BLOCK_INT_COLUMNS) :]])
    order = np.argsort(keys, kind="stable")
    return buckets, keys[order].astype(np.int64), ints[order].astype(np.int64), floats[order], channels_0


_INNER_COUNT = "SELECT COUNT(*) FROM rollups WHERE run_pk = ? AND level = ? AND block BETWEEN ? AND ?"


def _per_tile_read(
    session: Session, run: Run, tiling: Tiling, top: int, max_points: int
) -> tuple[_Buckets, np.ndarray, np.ndarray, np.ndarray, ChannelParts | None]:
    """_grouped_read's answer from every tile's row, dealt into buckets here: for a range with
    parts that hold no rows, level 0 at the top, and PostgreSQL's overflows."""
    stored, channels_0 = _read_tiles(session, run, tiling, top)
    at = len(BLOCK_INT_COLUMNS) + 2
    levels, blocks = stored[:, 0].astype(np.int64), stored[:, 1].astype(np.int64)
    buckets = _Buckets(np.unique((blocks << 2 * levels) >> 2 * top), top, max_points)
    return buckets, buckets.of(levels, blocks), stored[:, 2:at].astype(np.int64), stored[:, at:], channels_0


def series(
    session: Session,
    run: Run,
    max_points: int,
    step_min: int | None = None,
    step_max: int | None = None,
) -> dict[str, Any]:
    """Consecutive intervals grouped into at most `max_points` buckets, from the rollups.

    The level is the coarsest whose 4^level-interval blocks still number ≥ max_points over the
    range (so about max_points..4·max_points rows are read); blocks cut by the range's ends are
    summed exactly from finer levels. The blocks are then dealt into max_points buckets of
    consecutive blocks, as evenly as whole blocks allow, and merged (by the database where every
    part of the range holds rows, _grouped_read; else here, _per_tile_read), and the metrics
    derived with numpy. The channel rollups of the same blocks give each bucket's per-channel loss.
    """
    columns: dict[str, list[Any]] = {"step": [], "first_step": [], "last_step": []}
    columns.update({name: [] for name in METRIC})
    columns.update({name: [] for name in (*BAND_COLUMNS, *WALL_COLUMNS)})
    out: dict[str, Any] = {
        "run_id": run.run_id,
        "points": 0,
        "columns": columns,
        "wall_origin": wall_origin(session, run),
        "channel_loss": {},
        "channel_tokens": {},
    }
    span = _interval_range(session, run, step_min, step_max)
    if span is None:
        return out
    top = _chart_level(*span, max_points)
    if top == 0 and _more_rows_than(session, run, *span, LEVEL_0_ROWS_PER_POINT * max_points):
        top = 1  # many ranks: 4-interval resolution rather than grouping them all
    tiling = _tiling(*span, top)
    read = _grouped_read(session, run, span, tiling, top, max_points)
    buckets, keys, ints, floats, channels_0 = read or _per_tile_read(session, run, tiling, top, max_points)
    if len(keys):  # ints: counts and steps, exact below 2^53
        _, ints, floats = merge_blocks(keys, ints, floats)
        sums = {name: floats[:, i] for i, name in enumerate(SUM_NAMES)}
        columns["first_step"] = ints[:, 1].tolist()
        columns["last_step"] = ints[:, 2].tolist()
        columns["step"] = ints[:, 2].tolist()  # a bucket is drawn at its last step
        for name, values in derive_columns(sums, coefficients(run)).items():
            columns[name] = listed(values)
        for i, name in enumerate(BLOCK_FLOAT_COLUMNS[len(SUM_NAMES) :], start=len(SUM_NAMES)):
            columns[name] = listed(floats[:, i])
        out["channel_loss"], out["channel_tokens"] = _channel_series(session, run, tiling, top, buckets, channels_0)
    out["points"] = len(columns["step"])
    return out
