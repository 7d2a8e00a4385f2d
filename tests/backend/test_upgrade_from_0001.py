"""A database populated at revision 0001 (the first release) upgraded through 0002 to head keeps
its data: every run, every interval row, its histograms, sync sites and channel losses, and the
API answers from it what it answers for the same records ingested at head."""

import csv
import io
import json
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic.script import ScriptDirectory

from packscope.backend.store.db import alembic_config, make_engine, upgrade_schema
from packscope.core.catalogue import FIELDS
from packscope.core.flops import ModelSpec

RUNS = ("first", "second")
RANKS = 2
INTERVALS = 21  # not a multiple of 4: partial rollup blocks at every level


def wire_records(records: Any, run_index: int) -> list[dict[str, Any]]:
    out = []
    for rank in range(RANKS):
        for i, r in enumerate(records(INTERVALS, seed=10 * run_index + rank, rank=rank)):
            if i % 3 == 0:
                r["gpu"] = {"util_pct": 90.0 + rank, "power_w": 600.5, "energy_j": 1000.0 + i}
            if i % 4 == 1:
                r["channel_loss"] = {"code": 1.25 + i / 64, "web": 2.5}  # keys in sorted order
            if i % 5 == 2:
                r.pop("loss")  # an optional reading left out
            out.append(r)
    return out


def store_at_0001(engine: sa.Engine, body: dict[str, Any], recs: list[dict[str, Any]]) -> None:
    """The run and its records as revision 0001 stored them: a wide row (with the later dropped
    syncs_per_iteration), a row per non-empty histogram bucket, a row per sync site."""
    meta = sa.MetaData()
    meta.reflect(bind=engine)
    runs, intervals = meta.tables["runs"], meta.tables["intervals"]
    assert "syncs_per_iteration" in intervals.c and "interval_histograms" in meta.tables
    now = datetime.now(UTC)
    with engine.begin() as connection:
        run_pk = connection.execute(
            runs.insert()
            .values(
                run_id=body["run_id"],
                name=body["name"],
                project=body["project"],
                tags=body["tags"],
                config=body["config"],
                model=ModelSpec.from_dict(body["model"]).to_dict(),
                hardware=body["hardware"],
                parallel=body["parallel"],
                layout=body["layout"],
                status="running",
                started_at=datetime.fromisoformat(body["started_at"]),
                ended_at=None,
                created_at=now,
                updated_at=now,
            )
            .returning(runs.c.id)
        ).scalar_one()
        for rec in recs:
            row: dict[str, Any] = {"run_pk": run_pk, "channel_loss": rec.get("channel_loss")}
            for f in FIELDS:
                value: Any = rec
                for key in f.wire_path:
                    value = (value or {}).get(key)
                row[f.name] = value
            row["syncs_per_iteration"] = rec["syncs"]["total"] / rec["steps"]
            interval_id = connection.execute(intervals.insert().values(**row).returning(intervals.c.id)).scalar_one()
            for kind, hist in rec["histograms"].items():
                for bucket, (count, tokens) in enumerate(zip(hist["count"], hist["tokens"], strict=True)):
                    if count or tokens:
                        connection.execute(
                            meta.tables["interval_histograms"]
                            .insert()
                            .values(interval_id=interval_id, kind=kind, bucket=bucket, count=count, tokens=tokens)
                        )
            for site in rec["syncs"]["sites"]:
                connection.execute(
                    meta.tables["interval_sync_sites"]
                    .insert()
                    .values(interval_id=interval_id, site=site["site"], count=site["count"])
                )


def csv_rows(client: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's CSV export with numbers as floats and JSON cells decoded (PostgreSQL writes a
    whole float as 650, SQLite as 650.0)."""

    def value(key: str, cell: str) -> Any:
        if cell == "" or key in ("channel_loss", "channel_tokens"):
            return json.loads(cell) if cell else None
        return float(cell)

    text = client.get(f"/api/v1/runs/{run_id}/intervals.csv").text
    return [{k: value(k, v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(text))]


def answers(client: Any, run_id: str) -> dict[str, Any]:
    """What the API answers about one run, less the clocks of when it was stored."""
    base = f"/api/v1/runs/{run_id}"
    summary = client.get(base).json()
    for key in ("updated_at", "created_at", "last_contact_at"):
        summary.pop(key, None)
    return {
        "summary": summary,
        "series": client.get(f"{base}/series", params={"max_points": 7}).json(),
        "fine_series": client.get(f"{base}/series", params={"max_points": 500}).json(),
        "histograms": [client.get(f"{base}/histograms", params={"interval": i}).json() for i in (0, 9, INTERVALS - 1)],
        "sync_sites": client.get(f"{base}/sync-sites").json(),
        "csv": csv_rows(client, run_id),
    }


def close(got: Any, want: Any, path: str = "") -> None:
    """Equal, floats to 1e-9 relative (sums are added in another order by the backfill)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (path, got, want)
        for key in want:
            close(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (path, got, want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            close(g, w, f"{path}[{i}]")
    elif isinstance(want, float) and isinstance(got, int | float):
        assert abs(got - want) <= 1e-9 * max(abs(want), 1e-300), (path, got, want)
    else:
        assert got == want, (path, got, want)


def test_a_database_at_0001_upgrades_through_0002_to_head_with_its_data(
    database_url, make_client, new_run, records, tmp_path
):
    bodies = {run_id: new_run(run_id) for run_id in RUNS}
    recs = {run_id: wire_records(records, i) for i, run_id in enumerate(RUNS)}

    engine = make_engine(database_url)
    try:
        upgrade_schema(engine, "0001")
        for run_id in RUNS:
            store_at_0001(engine, bodies[run_id], recs[run_id])

        upgrade_schema(engine, "0002")
        with engine.connect() as connection:
            columns = {c["name"] for c in sa.inspect(connection).get_columns("intervals")}
            assert "syncs_per_iteration" not in columns
            assert connection.execute(sa.text("SELECT count(*) FROM intervals")).scalar_one() == 2 * RANKS * INTERVALS
            stored_sites = connection.execute(sa.text("SELECT count(*) FROM interval_sync_sites")).scalar_one()
            assert stored_sites == sum(len(r["syncs"]["sites"]) for run in recs.values() for r in run)

        upgrade_schema(engine)
        with engine.connect() as connection:
            version = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
        assert version == ScriptDirectory.from_config(alembic_config()).get_current_head()
    finally:
        engine.dispose()

    upgraded = make_client(database_url)  # starts with `upgrade head`: nothing left to do
    fresh = make_client(f"sqlite:///{tmp_path / 'ingested-at-head.db'}")
    for run_id in RUNS:
        assert fresh.post("/api/v1/runs", json=bodies[run_id]).status_code == 201
        answer = fresh.post(f"/api/v1/runs/{run_id}/intervals", json={"intervals": recs[run_id]})
        assert answer.json() == {"accepted": RANKS * INTERVALS, "duplicates": 0}

    listed = upgraded.get("/api/v1/runs").json()
    assert sorted(r["run_id"] for r in listed["runs"]) == sorted(RUNS)
    for run_id in RUNS:
        got, want = answers(upgraded, run_id), answers(fresh, run_id)
        assert got["summary"]["records"] == RANKS * INTERVALS
        assert [row["channel_loss"] for row in got["csv"]][:8] == [
            r.get("channel_loss") for r in sorted(recs[run_id], key=lambda r: (r["interval"], r["rank"]))
        ][:8]
        close(got, want, run_id)

    # The upgraded run goes on: a replay of stored records is all duplicates, new ones are added.
    replay = upgraded.post("/api/v1/runs/first/intervals", json={"intervals": recs["first"][:5]})
    assert replay.json() == {"accepted": 0, "duplicates": 5}
    more = records(3, start=INTERVALS, seed=99)
    assert upgraded.post("/api/v1/runs/first/intervals", json={"intervals": more}).json()["accepted"] == 3
    assert upgraded.get("/api/v1/runs/first").json()["records"] == RANKS * INTERVALS + 3
