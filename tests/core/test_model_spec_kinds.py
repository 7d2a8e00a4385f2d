"""ModelSpec with layer kinds: the coefficients per kind, the generalised triad on every kind of
value the backend evaluates, the strict model dict and compatibility with stored dicts."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from packscope.core.attention import SUM_NAMES, attention_sums
from packscope.core.flops import (
    MLA,
    FlopsBreakdown,
    LinearAttention,
    ModelSpec,
    flops_triad,
    flops_triad_by_kind,
    packs_breakdown,
    packs_breakdown_by_kind,
)

PACKS = [[4096, 2048, 1024, 512, 256, 256], [3000, 2500, 1500]]
BASE = dict(layers=6, hidden=512, heads=8, kv_heads=2, head_dim=64, ffn=1536, vocab=32000)
MIXED = ModelSpec(
    **BASE,
    layer_kinds=("sliding", "sliding", "full", "chunked", "chunked", "full"),
    window=1024,
    chunk=2048,
)


def old_coefficients(d: dict) -> tuple[int, int]:
    """c_lin and c_core as packscope computed them before layer kinds existed (the formula of
    docs/flops.md then, written out here so the comparison does not lean on the new code)."""
    h, n = d["hidden"], d["heads"]
    hd = d.get("head_dim") or h // n
    q, k = hd * n, hd * (d.get("kv_heads") or n)
    m = d.get("mtp_depth", 0)
    Lp = d["layers"] + m
    moe = d.get("moe_layers")
    n_moe = (sum(moe) + m * moe[-1]) if moe else 0
    f = 3 if d.get("gated", True) else 2
    step = d.get("vocab_divisor", 128) * d.get("tp", 1)
    vp = math.ceil(d["vocab"] / step) * step
    fe = d.get("moe_ffn") or d["ffn"]
    attn = h * (q + 2 * k) + q * h + (h * q if d.get("attn_output_gate") else 0)
    c_lin = 6 * (
        Lp * attn
        + h * f * d["ffn"] * (Lp - n_moe)
        + h * f * (fe * d.get("moe_topk", 0) + d.get("moe_shared_ffn", 0)) * n_moe
        + m * (3 * h + 2 * h * h)
        + h * vp * (m + 1)
    )
    return c_lin, 6 * Lp * q


# Model dicts as agents stored them before layer kinds (ModelSpec.to_dict() then, and the server's
# test model): they must load and give the same coefficients.
STORED = [
    {
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "ffn": 14336,
        "vocab": 128256,
        "kv_heads": 8,
        "head_dim": 128,
        "gated": True,
        "vocab_divisor": 128,
        "tp": 1,
        "moe_layers": None,
        "moe_ffn": None,
        "moe_topk": 0,
        "moe_shared_ffn": 0,
        "mtp_depth": 0,
        "attn_output_gate": False,
    },
    {
        "layers": 4,
        "hidden": 1024,
        "heads": 16,
        "ffn": 4096,
        "vocab": 32000,
        "kv_heads": 4,
        "head_dim": 64,
        "gated": True,
        "vocab_divisor": 128,
        "tp": 8,
        "moe_layers": [0, 1, 1, 1],
        "moe_ffn": 512,
        "moe_topk": 8,
        "moe_shared_ffn": 1024,
        "mtp_depth": 1,
        "attn_output_gate": True,
    },
    {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 2, "head_dim": 32, "ffn": 688, "gated": True, "vocab": 32000},
    {"layers": 12, "hidden": 768, "heads": 12, "ffn": 3072, "vocab": 50257, "gated": False, "vocab_divisor": 1},
]


@pytest.mark.parametrize("stored", STORED)
def test_stored_model_dicts_load_with_the_same_coefficients(stored):
    m = ModelSpec.from_dict(json.loads(json.dumps(stored)))
    assert (m.c_lin, m.c_core) == old_coefficients(stored)
    assert m.full_attention_only and m.c_core_by_kind == {"full": m.c_core}
    # Written back, a full-attention model has exactly the keys it had before layer kinds.
    assert set(m.to_dict()) == set(STORED[0])


def test_a_new_model_round_trips_through_json():
    m = dataclasses.replace(MIXED, mla=None)
    again = ModelSpec.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again == m and again.c_core_by_kind == m.c_core_by_kind
    mla = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=100, mla=MLA(32, 8, 4, 12, q_lora_rank=None))
    assert ModelSpec.from_dict(json.loads(json.dumps(mla.to_dict()))) == mla
    lin = ModelSpec(
        layers=2,
        hidden=64,
        heads=4,
        ffn=128,
        vocab=100,
        layer_kinds=("linear", "full"),
        linear_attention=LinearAttention(2, 4, 8, 6),
    )
    assert ModelSpec.from_dict(json.loads(json.dumps(lin.to_dict()))) == lin


def test_coefficients_per_kind():
    per_layer = 6 * BASE["heads"] * BASE["head_dim"]
    assert MIXED.c_core_by_kind == {"full": 2 * per_layer, "sliding": 2 * per_layer, "chunked": 2 * per_layer}
    assert MIXED.c_core == 2 * per_layer  # the full-attention layers' share only
    assert MIXED.c_core_by_sum == dict.fromkeys(SUM_NAMES, 2 * per_layer)
    # The linear work does not depend on the attention kinds.
    assert MIXED.c_lin == ModelSpec(**BASE).c_lin
    assert sum(MIXED.c_lin_by_component.values()) == MIXED.c_lin


def test_mla_coefficients():
    """DeepSeek-V3's shapes: QKᵀ over nope + rope = 192 per head, P·V over v = 128."""
    mla = MLA(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536)
    m = ModelSpec(layers=2, hidden=7168, heads=128, ffn=18432, vocab=129280, mla=mla, mtp_depth=1)
    assert m.c_core_by_kind == {"full": 3 * 3 * 128 * (192 + 128)}
    h, n = 7168, 128
    per_layer = h * 1536 + 1536 * n * 192 + h * (512 + 64) + 512 * n * (128 + 128) + n * 128 * h
    assert m.c_lin_by_component["attention"] == 6 * 3 * per_layer


def test_mtp_and_linear_layers_take_their_kind():
    m = ModelSpec(
        layers=4,
        hidden=64,
        heads=4,
        ffn=128,
        vocab=128,
        layer_kinds=("linear", "linear", "linear", "full"),
        linear_attention=LinearAttention(2, 4, 8, 6),
        mtp_depth=2,
    )
    assert m.kinds == ("linear", "linear", "linear", "full", "full", "full")
    assert m.c_core_by_kind == {"full": 3 * 6 * 4 * 16}
    assert m.full_attention_only  # linear layers have no sum: the two-sum triad still holds
    assert m.c_lin_by_component["linear_attention"] == 6 * 3 * LinearAttention(2, 4, 8, 6).projection_macs(64)


class Expr:
    """A stand-in for a SQL column expression: only + and * exist, and it records what was done."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __add__(self, other: object) -> Expr:
        return Expr(f"({self.text} + {other})")

    def __radd__(self, other: object) -> Expr:
        return Expr(f"({other} + {self.text})")

    def __mul__(self, other: object) -> Expr:
        return Expr(f"{self.text}*{other}")

    def __rmul__(self, other: object) -> Expr:
        return Expr(f"{other}*{self.text}")

    def __str__(self) -> str:
        return self.text


def test_generalised_triad_on_ints_floats_numpy_and_expressions():
    sums = attention_sums(PACKS, 8192, window=1024, chunk=2048)
    tokens, real = 16384, 15192
    exact = MIXED.triad_by_kind(tokens, real, sums)
    assert exact["bshd"] >= exact["thd"] >= exact["useful"]
    floats = flops_triad_by_kind(
        float(tokens), float(real), {k: float(v) for k, v in sums.items()}, float(MIXED.c_lin), MIXED.c_core_by_sum
    )
    assert all(math.isclose(floats[k], exact[k], rel_tol=1e-12) for k in exact)
    np = pytest.importorskip("numpy")
    arrays = flops_triad_by_kind(
        np.array([tokens, 2 * tokens]),
        np.array([real, 2 * real]),
        {k: np.array([v, 2 * v], dtype=float) for k, v in sums.items()},
        float(MIXED.c_lin),
        MIXED.c_core_by_sum,
    )
    assert [float(x) for x in arrays["thd"]] == pytest.approx([exact["thd"], 2 * exact["thd"]], rel=1e-12)
    expr = flops_triad_by_kind(Expr("T"), Expr("R"), {k: Expr(k) for k in sums}, 7, {"seqlen_sq_sum_thd": 3})
    assert str(expr["thd"]) == "(T*7 + seqlen_sq_sum_thd*3)"
    assert str(expr["bshd"]) == "T*7"  # no bshd coefficient given: that sum is not read


def test_by_kind_triad_is_the_old_triad_for_full_attention_models():
    m = ModelSpec(**BASE)
    sums = attention_sums(PACKS, 8192)
    old = flops_triad(16384, 15192, sums["seqlen_sq_sum_bshd"], sums["seqlen_sq_sum_thd"], m.c_lin, m.c_core)
    assert (
        m.triad_by_kind(16384, 15192, sums)
        == old
        == m.triad(16384, 15192, *map(sums.get, ("seqlen_sq_sum_bshd", "seqlen_sq_sum_thd")))
    )
    by_kind = packs_breakdown_by_kind(m, PACKS, 8192)
    assert (by_kind.flops_bshd, by_kind.flops_thd, by_kind.flops_useful) == tuple(old.values())
    legacy = packs_breakdown(m, PACKS, 8192)
    assert isinstance(legacy, FlopsBreakdown) and legacy.flops_thd == old["thd"]


def test_kind_breakdown_splits_the_flops():
    r = packs_breakdown_by_kind(MIXED, PACKS, 8192)
    for view, total in (("bshd", r.flops_bshd), ("thd", r.flops_thd), ("useful", r.flops_useful)):
        assert r.linear_flops[view] + sum(r.attention_flops[view].values()) == total
    assert r.attention_flops["thd"]["sliding"] == r.sums["window_sq_sum_thd"] * MIXED.c_core_by_kind["sliding"]
    assert r.attention_flops["bshd"]["chunked"] == r.sums["chunk_sq_sum_bshd"] * MIXED.c_core_by_kind["chunked"]


@pytest.mark.parametrize(
    "call",
    [
        lambda: MIXED.triad(1, 1, 1, 1),
        lambda: MIXED.flops(1, 1),
        lambda: packs_breakdown(MIXED, PACKS),
        lambda: FlopsBreakdown.compute(MIXED, 1, 1, 1, 1),
    ],
)
def test_the_two_sum_api_refuses_a_model_it_would_undercount(call):
    with pytest.raises(ValueError, match="chunked and sliding layers"):
        call()


BAD_DICTS = [
    ({"layers": True}, "'layers' must be an integer"),
    ({"layers": 32.0}, "'layers' must be an integer"),
    ({"hidden": "4096"}, "'hidden' must be an integer"),
    ({"heads": 0}, "'heads' must be an integer from 1"),
    ({"vocab": 2**24 + 1}, "'vocab' must be an integer from 1 to 16777216"),
    ({"kv_heads": 0}, "'kv_heads' must be an integer from 1"),
    ({"head_dim": False}, "'head_dim' must be an integer"),
    ({"moe_topk": -1}, "'moe_topk' must be an integer from 0"),
    ({"gated": 1}, "'gated' must be true or false"),
    ({"moe_layers": [True, False, True, False]}, "0/1 flags"),
    ({"moe_layers": [1, 0]}, "2 entries for 4 layers"),
    ({"moe_layers": "1,0,1,0"}, "null or a list"),
    ({"layer_kinds": ["full", "local", "full", "full"]}, "unknown layer kind"),
    ({"layer_kinds": ["full", "sliding", "full", "full"]}, "'sliding' layers but no 'window'"),
    ({"window": 128}, "'window' is set but no layer is 'sliding'"),
    ({"chunk": 128}, "'chunk' is set but no layer is 'chunked'"),
    ({"layer_kinds": ["linear"] * 4}, "no 'linear_attention'"),
    ({"mla": {"kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4, "extra": 1}}, "extra"),
    ({"mla": [1, 2]}, "null or an object"),
    # A part's missing fields are named (found by schemathesis: a TypeError, so a 500, before).
    ({"layer_kinds": ["linear"] * 4, "linear_attention": {"num_key_heads": 2}}, "lacks the field.*num_value_heads"),
    ({"mla": {"kv_lora_rank": 8}}, "model mla lacks the field"),
    ({"bogus": 1}, "unknown model field"),
    ({"name": "llama"}, r"unknown model field\(s\) name"),  # a display name, not part of the wire
]


@pytest.mark.parametrize("change,message", BAD_DICTS)
def test_from_dict_is_strict(change, message):
    base = {"layers": 4, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 100, "moe_topk": 1}
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_dict({**base, **change})


def test_from_dict_refuses_a_non_object():
    with pytest.raises(ValueError, match="JSON object"):
        ModelSpec.from_dict([1, 2])  # type: ignore[arg-type]
