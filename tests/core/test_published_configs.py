"""The independent check on the published config.json of 14 models (tests/fixtures/hf/README.md).

Each model is built at its real size by transformers on the meta device (no weights) and packscope's
reading of the same file is held to it: C_lin per component against the module shapes, the
attention coefficient of each layer kind against the attention modules and transformers' own layer
types, and each kind's sum against the pairs transformers' mask builders let through at the real
window and chunk sizes, on packs with documents shorter and longer than the window or chunk.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from packscope.core.attention import ATTENTION_SUMS, CHUNKED, FULL, LINEAR, SLIDING, attention_sums
from packscope.core.flops import COMPONENTS, ModelSpec
from packscope.core.hf_config import read_hf_config, spec_from_hf_config
from tests.core import hf_meta as hf

PUBLISHED = Path(__file__).parent.parent / "fixtures" / "hf" / "published"
FIXTURES = sorted(p.name for p in PUBLISHED.glob("*.json"))
HF_KIND = {"full_attention": FULL, "sliding_attention": SLIDING, "chunked_attention": CHUNKED}


def test_all_fourteen_published_configs_are_here():
    assert len(FIXTURES) == 14


def loadable(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config as transformers 5.24 accepts it, without changing a GEMM or a mask:
    * no ``quantization_config`` (fp8 / mxfp4 storage; the bf16 shapes are the same);
    * Llama 4's published ``attn_temperature_tuning: 4`` as ``true``: transformers 5.24's strict
      config refuses an int there (it only switches the NoPE layers' query scaling on)."""
    cfg = copy.deepcopy(cfg)
    cfg.pop("quantization_config", None)
    text = cfg.get("text_config", cfg)
    if isinstance(text.get("attn_temperature_tuning"), int) and not isinstance(text["attn_temperature_tuning"], bool):
        text["attn_temperature_tuning"] = bool(text["attn_temperature_tuning"])
    return cfg


def raw(name: str) -> dict[str, Any]:
    return json.loads((PUBLISHED / name).read_text())


@functools.cache
def spec(name: str) -> ModelSpec:
    return read_hf_config(PUBLISHED / name)


@functools.cache
def hf_config(name: str):
    return hf.config_from_dict(loadable(raw(name)))


@functools.cache
def meta_model(name: str):
    return hf.build(hf_config(name))


def deviation(ours: int, theirs: int) -> float:
    return abs(ours - theirs) / theirs if theirs else float(ours != 0)


@pytest.mark.parametrize("name", FIXTURES)
def test_linear_work_per_component_is_the_module_shapes(name):
    m = spec(name)
    model = meta_model(name)
    mtp = hf.build_mtp(model, m.mtp_depth) if m.mtp_depth else None
    theirs = hf.gemm_components(model, mtp)
    if m.mtp_depth:
        theirs["mtp"] += 6 * 3 * m.hidden * m.mtp_depth  # Megatron's norm term, the one no module holds
    ours = m.c_lin_by_component
    worst = {key: deviation(ours[key], theirs.get(key, 0)) for key in COMPONENTS if ours[key] or theirs.get(key)}
    assert max(worst.values()) <= 1e-3, worst  # the brief's tolerance ...
    assert {k: v for k, v in ours.items() if v} == theirs  # ... and in fact exact


@pytest.mark.parametrize("name", FIXTURES)
def test_layer_kinds_and_attention_coefficient_per_kind(name):
    m = spec(name)
    model = meta_model(name)
    kinds = [HF_KIND[k] for k in hf.transformers_layer_kinds(model)]
    assert list(m.kinds[: m.layers]) == kinds
    per_layer = {3 * hf.core_macs_per_pair(model, i) for i in range(m.layers)}
    assert len(per_layer) == 1, "every layer has the same head widths"
    (coefficient,) = per_layer
    expected = {kind: coefficient * (kinds + [kinds[-1]] * m.mtp_depth).count(kind) for kind in set(kinds)}
    assert m.c_core_by_kind == {k: v for k, v in expected.items() if k != LINEAR}
    text = hf_config(name).get_text_config()
    assert m.window == (text.sliding_window if SLIDING in kinds else None)
    assert m.chunk == (text.attention_chunk_size if CHUNKED in kinds else None)


def packs_for(size: int) -> list[list[int]]:
    """Rows around a window or chunk of ``size``: a packed row with one document shorter than it
    and one longer (not a multiple of it), and a row shorter than it."""
    short, long = size // 2 + 3, size + size // 8 + 5
    return [[short, long], [short]]


FULL_SIZE = 512  # full attention has no size; its rows need not be long


@functools.cache
def pairs_of(hf_kind: str, size: int | None, docs: tuple[int, ...], name: str) -> int:
    """Pairs of transformers' mask for ``hf_kind`` on one row. The mask depends on the config only
    through its window or chunk, so equal sizes are counted once (``name``: the first asking)."""
    return hf.mask_pairs(hf.config_from_dict(loadable(raw(name))), hf_kind, list(docs))


_FIRST: dict[tuple[str, int | None], str] = {}


def _kinds_with_sizes(m: ModelSpec) -> list[tuple[str, str, int | None]]:
    out: list[tuple[str, str, int | None]] = []
    if SLIDING in m.kinds:
        out.append((SLIDING, "sliding_attention", m.window))
    if CHUNKED in m.kinds:
        out.append((CHUNKED, "chunked_attention", m.chunk))
    if FULL in m.kinds:
        out.append((FULL, "full_attention", None))
    return out


@pytest.mark.slow  # ~15 s in all: rows of up to 13,000 tokens at Llama 4's chunk of 8192
@pytest.mark.parametrize("name", FIXTURES)
def test_each_kind_sum_is_the_pairs_of_transformers_masks(name):
    m = spec(name)
    for kind, hf_kind, size in _kinds_with_sizes(m):
        first = _FIRST.setdefault((hf_kind, size), name)
        for docs in packs_for(size or FULL_SIZE):
            sums = attention_sums([docs], window=m.window, chunk=m.chunk)
            pairs = pairs_of(hf_kind, size, tuple(docs), first)
            over = sum(min(s, size) for s in docs) if kind == SLIDING and size else sum(docs)  # docs/flops.md
            assert 2 * pairs == sums[ATTENTION_SUMS[kind].thd] + over, (kind, docs)


@pytest.mark.parametrize("name", FIXTURES)
def test_a_loaded_transformers_config_reads_as_its_file(name):
    """``spec_from_hf_config(model.config)`` (after transformers' own defaults and derivations)
    and the config.json give the same model."""
    assert spec_from_hf_config(hf_config(name)) == spec(name)
