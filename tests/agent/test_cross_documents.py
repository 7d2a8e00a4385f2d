"""The cross-document check (agent/integrations/cross_documents.py) on tiny random configs: it
fires on a model that ignores document boundaries in a batch form (GPT-OSS's masks never read
position_ids in transformers 5.25; any model under sdpa given flash-attention kwargs alone) and
stays silent on one that keeps them (Llama, Qwen2 with position_ids flattening); what it cannot
build or run is "not checked", never an exception. In the HF Trainer a crossing is a warning in
the log, the run page's fact, and whole-row attention in the counts."""

from __future__ import annotations

import logging
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("datasets")

from packscope.agent.integrations import cross_documents as cd  # noqa: E402
from packscope.agent.integrations.hf import PackscopeCallback  # noqa: E402
from packscope.core.attention import chunk_sq, window_sq  # noqa: E402
from tests.agent.test_integrations_hf import Recorded, dataset, tiny_model, train  # noqa: E402
from tests.core.tiny_configs import TINY  # noqa: E402

FLAT = ("position_ids",)  # DataCollatorWithFlattening
FLASH = ("cu_seq_lens_q", "position_ids")  # ... with return_flash_attn_kwargs=True


@pytest.fixture(autouse=True)
def _one_thread_and_a_folder(tmp_path, monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)  # the Trainer's output_dir
    yield
    torch.set_num_threads(before)


def config_of(name: str, attention: str = "sdpa", **overrides):
    cfg = dict(TINY[name], **overrides)
    cfg.setdefault("use_cache", False)  # what the Trainer sets (TrainingArguments.use_cache)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config._attn_implementation = attention
    return config


def gpt_oss():
    torch.manual_seed(0)
    return transformers.GptOssForCausalLM(config_of("gpt_oss", "eager", vocab_size=64))


def check_of(config) -> cd.CrossDocumentCheck:
    cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    check = cd.CrossDocumentCheck(config, cls)
    check.build()
    return check


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3_moe", "mistral"])
def test_silent_on_models_that_keep_documents_apart_when_flattened(name):
    check = check_of(config_of(name))
    for form in (FLAT, FLASH):
        verdict = check.verdict(form)
        assert verdict.status == cd.KEPT, verdict.detail
        assert "attends only to itself" in verdict.detail


def test_fires_on_gpt_oss_whose_masks_ignore_the_positions():
    check = check_of(config_of("gpt_oss", "eager"))  # transformers 5.25's GptOss refuses sdpa
    for form in (FLAT, FLASH, ("position_ids", "attention_mask")):
        verdict = check.verdict(form)
        assert verdict.crossed and "attend to each other" in verdict.detail, verdict.detail
        assert verdict.whole_rows and "masks do not split the row" in verdict.detail


def test_fires_where_the_batch_form_loses_the_boundaries_on_any_model():
    """sdpa reads no flash-attention kwargs, and transformers splits rows by position ids only
    without a 2-D attention mask: both forms attend across documents on Llama too."""
    check = check_of(config_of("llama"))
    assert check.verdict(("cu_seq_lens_q",)).crossed
    assert check.verdict(("position_ids", "attention_mask")).crossed
    assert not check.verdict(FLAT).crossed


def test_the_verdict_follows_a_forward_that_builds_a_cache():
    """transformers builds a cache from config.use_cache (and then no per-document mask): a loop
    that leaves it on attends across documents, which the copy, built from the same config, sees."""
    verdict = check_of(config_of("llama", use_cache=True)).verdict(FLAT)
    assert verdict.crossed and verdict.whole_rows
    assert "(model.config.use_cache is on), beside which transformers builds no per-document mask" in verdict.detail
    assert "with it off, the documents stay apart" in verdict.detail


def test_the_copy_trains_as_the_model_does_with_activation_checkpointing():
    """In training, activation checkpointing turns the cache off, and with it the crossing."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config_of("llama", use_cache=True))
    model.activation_checkpointing_enable()
    check = cd.CrossDocumentCheck.of(model)
    check.build()
    assert check.verdict(FLAT).status == cd.KEPT


def test_the_tiny_copy_is_small_and_of_the_same_class():
    config = config_of("gpt_oss", "eager", hidden_size=2880, intermediate_size=2880, num_hidden_layers=24)
    tiny = cd.tiny_config(config)
    assert type(tiny) is type(config) and tiny.hidden_size == 2 * config.head_dim
    assert tiny.num_hidden_layers == 2 and set(tiny.layer_types) == set(config.layer_types)
    assert (config.hidden_size, config.num_hidden_layers) == (2880, 24)  # the original is untouched
    check = check_of(config)
    assert sum(p.numel() for p in check._tiny.parameters()) < 100_000
    assert check.verdict(FLAT).crossed


def test_what_cannot_be_built_or_run_is_not_checked():
    # An attention implementation that does not run on the CPU.
    verdict = check_of(config_of("llama", "flash_attention_2")).verdict(FLAT)
    assert (verdict.status, verdict.detail) == (
        cd.NOT_CHECKED,
        "its attention implementation 'flash_attention_2' does not run on the CPU",
    )

    # An architecture that cannot be built small.
    class Big(transformers.LlamaForCausalLM):
        def __init__(self, config):
            if config.hidden_size < 1024:
                raise ValueError("this model needs a hidden size of at least 1024")
            super().__init__(config)

    check = cd.CrossDocumentCheck(config_of("llama"), Big)
    check.build()
    verdict = check.verdict(FLAT)
    assert verdict.status == cd.NOT_CHECKED and "could not be built" in verdict.detail and "1024" in verdict.detail

    # A model that is not a transformers model, and a forward that fails.
    assert cd.CrossDocumentCheck.of(torch.nn.Linear(2, 2)).verdict(FLAT).status == cd.NOT_CHECKED

    class Failing(transformers.LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            raise RuntimeError("no forward today")

    verdict = check_of_class(config_of("llama"), Failing).verdict(FLAT)
    assert verdict.status == cd.NOT_CHECKED and "no forward today" in verdict.detail


def check_of_class(config, cls) -> cd.CrossDocumentCheck:
    check = cd.CrossDocumentCheck(config, cls)
    check.build()
    return check


def test_the_check_leaves_the_trainers_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    check_of(config_of("mixtral")).verdict(FLAT)
    assert torch.equal(torch.rand(3), expected)


def test_forms_are_named_from_the_forwards_keys():
    ids = torch.zeros(1, 6, dtype=torch.long)
    pos = torch.arange(6).unsqueeze(0)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    mask = torch.ones(1, 6)
    assert cd.form_of({"input_ids": ids, "position_ids": pos}) == FLAT
    assert cd.form_of({"input_ids": ids, "position_ids": pos, "cu_seq_lens_q": cu}) == FLASH
    assert cd.form_of({"input_ids": ids, "position_ids": pos, "attention_mask": mask}) == (
        "position_ids",
        "attention_mask",
    )
    assert cd.form_of({"input_ids": ids, "position_ids": pos.expand(4, 1, 6)}) == ("position_ids[4]",)
    assert cd.form_of({"input_ids": ids, "attention_mask": mask}) is None  # padded rows: no documents to cross
    assert cd.form_of({"input_ids": ids}) is None


def whole_rows(batches, spec) -> dict[str, int]:
    """The THD attention sums of flattened rows each attended as one sequence of its documents."""
    rows = [sum(sum(row) for row in rows) for rows, _ in batches]
    return {
        "seqlen_sq_sum_thd": sum(s * s for s in rows),
        "window_sq_sum_thd": sum(window_sq(s, spec.window) for s in rows) if spec.window else 0,
        "chunk_sq_sum_thd": sum(chunk_sq(s, spec.chunk) for s in rows) if spec.chunk else 0,
    }


def test_in_the_trainer_a_crossing_is_logged_and_counted_as_whole_rows(caplog):
    recorded = Recorded(transformers.DataCollatorWithFlattening(), flattens=True)
    with caplog.at_level(logging.INFO, logger="packscope.agent"):
        _, cb = train(gpt_oss(), recorded, train_dataset=dataset())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "attend" in r.getMessage()]
    assert len(warnings) == 1  # once per batch form
    assert warnings[0].startswith(
        "packscope: GptOssForCausalLM with position_ids batches: packed documents attend to each other"
    )
    assert "This is a training bug" in warnings[0]
    spec, records = cb.agent.model, list(cb.agent.records)
    per_interval = 2 * 2  # logging_steps x gradient accumulation
    for i, record in enumerate(records):
        trained = recorded.batches[i * per_interval : (i + 1) * per_interval]
        assert {k: record[k] for k in ("seqlen_sq_sum_thd", "window_sq_sum_thd", "chunk_sq_sum_thd")} == whole_rows(
            trained, spec
        )
        assert record["documents"] == sum(len(row) for rows, _ in trained for row in rows) > record["packs"]
        # Flattened rows without padding: the work done is the baseline's.
        assert record["flops_thd"] == record["flops_bshd"]


def test_in_the_trainer_a_model_that_keeps_documents_apart_counts_them_and_warns_nothing(caplog):
    recorded = Recorded(transformers.DataCollatorWithFlattening(), flattens=True)
    with caplog.at_level(logging.INFO, logger="packscope.agent"):
        _, cb = train(tiny_model("llama"), recorded, train_dataset=dataset())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "attend" in r.getMessage()]
    assert cb.cross_check is not None and cb.cross_check.verdict(FLAT).status == cd.KEPT
    docs = [d for rows, _ in recorded.batches[:8] for row in rows for d in row]
    assert sum(r["seqlen_sq_sum_thd"] for r in cb.agent.records) == sum(d * d for d in docs)


def test_the_check_can_be_turned_off():
    recorded = Recorded(transformers.DataCollatorWithFlattening(), flattens=True)
    _, cb = train(gpt_oss(), recorded, train_dataset=dataset(), callback=PackscopeCallback(check_cross_documents=False))
    assert cb.cross_check is None
    docs = [d for rows, _ in recorded.batches[:8] for row in rows for d in row]
    assert sum(r["seqlen_sq_sum_thd"] for r in cb.agent.records) == sum(d * d for d in docs)


@pytest.mark.slow  # starts the real backend: about 13 s here
def test_a_crossing_reaches_the_run_page_facts(tmp_path):
    from tests.e2e.conftest import Backend, free_port

    backend = Backend(f"sqlite:///{tmp_path / 'hf.db'}", free_port()).start()
    try:
        cb = PackscopeCallback(server=backend.url, run_name="oss-flat", spool_dir=str(tmp_path / "spool"))
        train(
            gpt_oss(),
            Recorded(transformers.DataCollatorWithFlattening(), flattens=True),
            train_dataset=dataset(),
            callback=cb,
        )
        run = backend.get(f"/api/v1/runs/{cb.agent.run_id}")
        assert run["cross_documents"] == "crossed"
        assert run["cross_documents_detail"] == cb.cross_check.verdict(FLAT).detail
        assert [r["seqlen_sq_sum_thd"] for r in backend.csv_rows(cb.agent.run_id)] == [
            str(r["seqlen_sq_sum_thd"]) for r in cb.agent.records
        ]
    finally:
        backend.stop()


# The verdict, from logits, against transformers' own masks: the (query, key) pairs each attention
# layer's mask lets through in a real forward of the packed row, fed as the HF Trainer feeds a
# DataCollatorWithFlattening row (tests/core/hf_meta.py, the independent check's instrument, with
# as_trained), equal those of one undivided row exactly when the masks ignore the documents: then the
# verdict is a crossing counted whole-row. The gated delta-nets of Qwen3-Next and Qwen3.5 (without
# flash-linear-attention and causal-conv1d) carry state across a row that their masks split: a
# crossing whose attention work stays per document.
STATE_LEAKS = {"qwen3_next", "qwen3_5", "qwen3_5_moe"}
NO_FORWARD = {"llama4"}  # as in tests/core/test_independent_tiny.py
EAGER_ONLY = {"gpt_oss", "gemma2"}  # transformers 5.25 refuses sdpa for them
# The five wrappers (and Qwen3-Omni's thinker) whose language model reads its text config's
# use_cache, which the Trainer leaves on: a KV cache is built, and beside it no per-document mask.
TEXT_CACHE = ["qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "internvl", "qwen3_omni_moe_thinker"]


def config_from(cfg: dict, attention: str, text_cache: bool | None = None):
    """A config as the Trainer leaves it (``model.config.use_cache = False``, the top-level one
    only); ``text_cache`` sets the text config's use_cache too (False: a user who turns it off)."""
    cfg = dict(cfg)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config.use_cache = False
    config._attn_implementation = attention
    config.get_text_config()._attn_implementation = attention
    if text_cache is not None:
        config.get_text_config().use_cache = text_cache
    return config


def model_class(config):
    wrapper = config.get_text_config() is not config
    return (transformers.AutoModelForImageTextToText if wrapper else transformers.AutoModelForCausalLM)._model_mapping[
        type(config)
    ]


def verdict_and_masks(cfg: dict, attention: str = "sdpa", text_cache: bool | None = None):
    """The check's verdict for flattened rows, and whether transformers' masks let the documents
    meet in a forward fed as the Trainer feeds it (packed pairs == those of one undivided row)."""
    from tests.core import hf_meta as hf

    config = config_from(cfg, attention, text_cache)
    verdict = check_of_class(config, model_class(config)).verdict(FLAT)
    torch.manual_seed(0)
    model = hf.build(config_from(cfg, hf.COUNT, text_cache), "cpu").eval()
    packed, undivided = (
        hf.count_pairs_in_forward(model, docs, as_trained=True) for docs in (list(cd.DOCS), [sum(cd.DOCS)])
    )
    assert packed, "no attention layer was counted"
    return verdict, packed == undivided


def assert_verdict_is_the_masks(name: str, verdict, masks_cross: bool) -> None:
    assert verdict.whole_rows == masks_cross, verdict.detail
    if name in STATE_LEAKS:
        assert verdict.crossed, verdict.detail
    else:
        assert verdict.crossed == masks_cross, verdict.detail


@pytest.mark.parametrize("name", sorted(set(TINY) - NO_FORWARD))
def test_the_verdict_is_what_transformers_masks_let_through(name):
    verdict, masks_cross = verdict_and_masks(TINY[name], "eager" if name in EAGER_ONLY else "sdpa")
    assert_verdict_is_the_masks(name, verdict, masks_cross)


@pytest.mark.parametrize("text_cache", [None, False], ids=["as-the-trainer-leaves-it", "text-cache-off"])
@pytest.mark.parametrize("name", TEXT_CACHE)
def test_the_wrappers_verdict_is_what_their_masks_let_through(name, text_cache):
    from tests.agent.structural_configs import WRAPPERS

    verdict, masks_cross = verdict_and_masks(WRAPPERS[name], text_cache=text_cache)
    assert masks_cross == (text_cache is None)  # the cache the language model builds, and only it
    assert_verdict_is_the_masks(name, verdict, masks_cross)


@pytest.mark.parametrize("name", TEXT_CACHE)
def test_fires_on_wrappers_whose_language_model_builds_a_cache_and_says_how_to_stop_it(name):
    from tests.agent.structural_configs import WRAPPERS

    config = config_from(WRAPPERS[name], "sdpa")
    assert config.use_cache is False and config.get_text_config().use_cache is True  # what the Trainer leaves
    verdict = check_of_class(config, model_class(config)).verdict(FLAT)
    assert verdict.crossed and verdict.whole_rows, verdict.detail
    assert "attend to each other" in verdict.detail
    # The reason, and what the copy does with the text cache off: Qwen3.5's state still leaks.
    assert "(model.config.get_text_config().use_cache is on; the Trainer turns off only" in verdict.detail
    then = (
        "the masks split the row but a layer's state still carries"
        if name in STATE_LEAKS
        else "the documents stay apart"
    )
    assert f"with it off, {then}" in verdict.detail, verdict.detail


def test_qwen2_5_vl_packs_with_its_four_row_positions_only_with_its_text_cache_off():
    """Flat Qwen2.5-VL configs (its checkpoints') hand use_cache to the text config at construction;
    the Trainer's later model.config.use_cache = False does not reach it: even the [4, batch,
    length] positions it packs with cross then, and plain 2-D positions cross either way."""
    four = ("position_ids[4]",)
    config = config_from(TINY["qwen2_5_vl"], "sdpa")
    check = check_of_class(config, model_class(config))
    assert check.verdict(four).whole_rows and "with it off, the documents stay apart" in check.verdict(four).detail
    assert check.verdict(FLAT).whole_rows and "with it off, the masks still do not split" in check.verdict(FLAT).detail
    config = config_from(TINY["qwen2_5_vl"], "sdpa", text_cache=False)
    check = check_of_class(config, model_class(config))
    assert check.verdict(four).status == cd.KEPT
    assert check.verdict(FLAT).whole_rows and "KV cache" not in check.verdict(FLAT).detail


@pytest.mark.parametrize("name", ["qwen3_vl", "qwen3_vl_moe", "internvl"])
def test_silent_on_those_wrappers_with_their_text_cache_off(name):
    from tests.agent.structural_configs import WRAPPERS

    for attention in ("sdpa", "eager"):
        config = config_from(WRAPPERS[name], attention, text_cache=False)
        verdict = check_of_class(config, model_class(config)).verdict(FLAT)
        assert verdict.status == cd.KEPT and not verdict.whole_rows, verdict.detail


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_5_moe"])
def test_a_state_leak_fires_but_keeps_the_attention_per_document(name):
    """Qwen3.5's masks split the row once its text cache is off, but its gated delta-net layers
    (the torch fallback, which reads no document boundaries) still carry the first document into
    the second: crossed, said to be a layer's state, attention counted per document."""
    from tests.agent.structural_configs import WRAPPERS

    for attention in ("sdpa", "eager"):
        config = config_from(WRAPPERS[name], attention, text_cache=False)
        verdict = check_of_class(config, model_class(config)).verdict(FLAT)
        assert verdict.crossed and not verdict.whole_rows, verdict.detail
        assert "carries state along the row" in verdict.detail and "attention work is per document" in verdict.detail


def test_in_the_trainer_a_state_leak_is_logged_and_its_attention_counted_per_document(caplog):
    """Qwen3-Next's gated delta-net (the torch fallback) carries the first document into the next;
    its masks split the row: one warning naming a layer's state, and per-document attention sums."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_of("qwen3_next", vocab_size=64))
    recorded = Recorded(transformers.DataCollatorWithFlattening(), flattens=True)
    with caplog.at_level(logging.INFO, logger="packscope.agent"):
        _, cb = train(model, recorded, train_dataset=dataset())
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "reach each other" in r.getMessage()
    ]
    assert len(warnings) == 1 and "carries state along the row" in warnings[0], warnings
    assert "counts these batches' attention per document" in warnings[0]
    docs = [d for rows, _ in recorded.batches[:8] for row in rows for d in row]
    assert sum(r["seqlen_sq_sum_thd"] for r in cb.agent.records) == sum(d * d for d in docs)
    assert cb.agent.records and all(r["flops_thd"] < r["flops_bshd"] for r in cb.agent.records)


@pytest.mark.parametrize("name", ["gemma3n_text", "gemma4_text", "gemma4_text_moe"])
def test_gemma_copies_are_built_small_and_their_verdict_is_the_masks(name):
    """Gemma 4's full layers have their own head width and KV heads (transformers' per_layer_config,
    which refuses a global read) and its top-k is top_k_experts: the small copy is still built, and
    its verdict is what transformers' masks let through, as for every other model."""
    from tests.agent.structural_configs import STRUCTURAL

    verdict, masks_cross = verdict_and_masks(STRUCTURAL[name])
    assert verdict.status != cd.NOT_CHECKED, verdict.detail
    assert_verdict_is_the_masks(name, verdict, masks_cross)


def test_the_check_runs_on_the_cpu_whatever_the_default_device(monkeypatch):
    """A trainer may set a default device (torch.set_default_device): the copy and its batch stay on
    the CPU. Checked with the meta device, which runs nothing: a tensor made there would fail."""
    check = cd.CrossDocumentCheck(config_of("gpt_oss", "eager"), transformers.GptOssForCausalLM)
    with torch.device("meta"):
        check.build()
        assert check.verdict(FLAT).crossed
