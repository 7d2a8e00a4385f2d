"""A model with zero-computation experts (LongCat-Flash): the record's expert_assignments reach
every table that keeps the catalogue's SUMS, and the server's FLOPs price them at the model's
c_assignment beside its fixed c_lin (the routed experts left out of it); migration 0023 adds and
removes the column."""

import pytest
from sqlalchemy import inspect, text

from packscope.backend.store.db import make_engine, upgrade_schema
from packscope.core.catalogue import FLOAT_OPS, SUM, Coefficients, flops_count
from packscope.core.flops import Measured, ModelSpec
from tests.backend.migrating import downgrade

# The shape of a structural count with zero-computation experts (tests/agent/test_longcat_flash.py
# holds the real one to torch's own counts): its fixed work, and its routed experts per assignment.
ROUTED = ModelSpec(
    layers=2,
    hidden=32,
    heads=4,
    ffn=48,
    vocab=96,
    measured=Measured(
        c_lin=(("attention", 76_800), ("dense_mlp", 55_296), ("logits", 18_432)),
        c_core=(("full", 960),),
        c_assignment=9_216,
        routed_slots=6,
    ),
)


def test_the_server_prices_the_assignments_the_agent_counted(make_client, database_url, new_run, records):
    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run(model=ROUTED.to_dict())).status_code == 201
    recs = records(8)
    for r in recs:
        r["expert_assignments"] = r["tokens"] * 4  # 4 of the 6 slots a token to real experts
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": recs}).json()["accepted"] == 8
    totals = client.get("/api/v1/runs/run-1").json()["totals"]
    fixed = sum(dict(ROUTED.measured.c_lin).values())
    for view, s2 in (("thd", "seqlen_sq_sum_thd"), ("bshd", "seqlen_sq_sum_bshd")):
        want = sum(fixed * r["tokens"] + 960 * r[s2] + 9_216 * r["expert_assignments"] for r in recs)
        assert totals[f"flops_{view}"] == pytest.approx(want, rel=1e-12), view
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            stored = connection.execute(text("SELECT expert_assignments FROM intervals ORDER BY interval")).all()
            total = connection.execute(text("SELECT expert_assignments FROM run_totals")).scalar_one()
        assert [s for (s,) in stored] == [r["expert_assignments"] for r in recs]
        assert total == sum(r["expert_assignments"] for r in recs)
        downgrade(engine, "0022")
        with engine.connect() as connection:
            for table in ("intervals", "rollups", "run_totals", "run_first_interval"):
                assert "expert_assignments" not in {c["name"] for c in inspect(connection).get_columns(table)}
        upgrade_schema(engine)
    finally:
        engine.dispose()


def test_the_coefficients_of_a_routed_model_and_of_any_other():
    c = Coefficients.for_run(ROUTED.to_dict(), {})
    assert (c.c_lin, c.c_assignment) == (ROUTED.c_lin_fixed, 9_216)
    sums = {"tokens": 10.0, "real_tokens": 8.0, "seqlen_sq_sum_thd": 50.0, "expert_assignments": 40.0}
    assert flops_count("thd", sums, c) == ROUTED.c_lin_fixed * 10 + 960 * 50 + 9_216 * 40
    # a record of any other model lacks the field: it adds 0 to the sum
    assert SUM["expert_assignments"].value({"expert_assignments": None}, FLOAT_OPS) == 0
    assert Coefficients.for_run(ROUTED.with_routed_fraction(0.5).to_dict(), {}).c_assignment == 0
