"""A measured model (the structural count's ModelSpec.measured): its coefficients replace the
formula's, survive the wire dict, and are read strictly."""

from __future__ import annotations

import pytest

from packscope.core.flops import COMPONENTS, Measured, ModelSpec, packs_breakdown_by_kind

BASE = dict(layers=2, hidden=8, heads=2, ffn=16, vocab=32, layer_kinds=("linear", "sliding"), window=3)


def measured_model() -> ModelSpec:
    return ModelSpec(**BASE, measured=Measured(c_lin=(("attention", 600), ("logits", 60)), c_core={"sliding": 30}))


def test_measured_coefficients_replace_the_formula():
    m = measured_model()
    assert m.c_lin_by_component == {key: {"attention": 600, "logits": 60}.get(key, 0) for key in COMPONENTS}
    assert m.c_lin == 660
    assert m.c_core_by_kind == {"sliding": 30}
    b = packs_breakdown_by_kind(m, [[2, 5]], 8)
    # By hand: T = 8 slots; window sums with W = 3: 2² + (2·5·3 - 9) = 25 (THD), 2·8·3 - 9 = 39 (BSHD).
    assert (b.flops_thd, b.flops_bshd, b.flops_useful) == (8 * 660 + 25 * 30, 8 * 660 + 39 * 30, 7 * 660 + 25 * 30)


def test_a_measured_model_round_trips_through_its_dict():
    m = measured_model()
    data = m.to_dict()
    assert data["measured"] == {"c_lin": {"attention": 600, "logits": 60}, "c_core": {"sliding": 30}}
    back = ModelSpec.from_dict(data)
    assert back == m and back.c_lin == m.c_lin and back.c_core_by_kind == m.c_core_by_kind


def test_a_model_without_measured_gives_the_dict_it_gave_before():
    assert "measured" not in ModelSpec(layers=2, hidden=8, heads=2, ffn=16, vocab=32).to_dict()


@pytest.mark.parametrize(
    "measured, message",
    [
        ({"c_lin": {"attention": True}}, "measured.c_lin.attention must be an integer"),
        ({"c_lin": {"attention": "6"}}, "measured.c_lin.attention must be an integer"),
        ({"c_lin": {"attention": -1}}, "measured.c_lin.attention must be an integer"),
        ({"c_lin": {"routers": 6}}, "names 'routers'"),
        ({"c_lin": {}, "c_core": {"linear": 6}}, "names 'linear'"),
        ({"c_lin": {}, "extra": 1}, "unknown model measured field"),
        ({"c_core": {}}, "lacks the field"),
        ({"c_lin": [1, 2]}, "must be an object"),
    ],
)
def test_a_bad_measured_object_is_refused_by_name(measured, message):
    data = {**measured_model().to_dict(), "measured": measured}
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_dict(data)


def test_the_server_derives_a_measured_models_coefficients_from_its_stored_dict():
    from packscope.core.catalogue import Coefficients

    m = measured_model()
    coefficients = Coefficients.for_run(m.to_dict(), {})
    assert (coefficients.c_lin, coefficients.c_core, coefficients.c_window) == (660, 0, 30)
