"""LongCat-Flash (model_type longcat_flash): its fixed work counted from its structure, its routed
experts priced per assignment to a real expert, both held to what torch counts (FlopCounterMode)
in a real forward and backward of a tiny model on the CPU, with the real assignments read off the
routers' own outputs."""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from packscope.agent.hf_structure import spec_from_structure  # noqa: E402
from packscope.core.flops import ModelSpec  # noqa: E402
from packscope.core.hf_fields import HFConfigError  # noqa: E402
from tests.agent.longcat import LONGCAT, cpu_model, real_assignments, zero_experts_skipped  # noqa: E402

warnings.filterwarnings("ignore", module="transformers")
LENGTH = 32


def _component(name: str) -> str | None:
    """The C_lin component of a GEMM module of LongcatFlashForCausalLM, by where it sits."""
    parts = name.split(".")
    if name == "lm_head":
        return "logits"
    if "router" in parts or "layers" not in parts:
        return None
    if "self_attn" in parts:
        return "attention"
    if "mlps" in parts:
        return "dense_mlp"
    if "experts" in parts:
        return "moe_routed"
    raise AssertionError(f"a GEMM module no component holds: {name}")


def counted(model: nn.Module, skip_zero: bool) -> tuple[dict[str, int], int, int, int]:
    """One forward on LENGTH tokens under FlopCounterMode: (FLOPs by component, the attention's
    eager matmuls, the real assignments the routers made); then the forward and backward of the same
    batch: (total FLOPs of that step)."""
    ids = torch.randint(0, model.config.vocab_size, (1, LENGTH))
    modules = dict(model.named_modules())
    with zero_experts_skipped(model) if skip_zero else contextlib.nullcontext(), real_assignments(model) as found:
        with FlopCounterMode(display=False) as forward:
            model(input_ids=ids, use_cache=False)
        assignments = int(sum(found))
        with FlopCounterMode(display=False) as step:
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    by_component: dict[str, int] = {}
    core = 0
    for key, ops in forward.get_flop_counts().items():
        name = key.split(".", 1)[1] if "." in key else ""
        module = modules.get(name)
        gemm = isinstance(module, nn.Linear) or name.endswith("mlp.experts")
        component = _component(name) if gemm else None
        if component is not None:
            by_component[component] = by_component.get(component, 0) + sum(ops.values())
        parts = name.split(".")
        if len(parts) > 1 and parts[-2] == "self_attn":  # one of a layer's two attentions
            core += int(ops.get(torch.ops.aten.bmm, 0))
    router = sum(sum(ops.values()) for key, ops in forward.get_flop_counts().items() if key.endswith("router"))
    total_forward = sum(forward.get_flop_counts()["Global"].values())
    total_step = sum(step.get_flop_counts()["Global"].values())
    assert total_step == 3 * total_forward  # every GEMM's backward is twice its forward: x3 holds
    return by_component, core, assignments, total_step - 3 * router


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return spec_from_structure(LONGCAT)


def test_fixed_work_and_the_real_assignments_are_what_torch_counts(spec):
    """Per component, forward x 3 (the step's backward is checked to be twice its forward): the
    attention and dense MLPs per token, the routed experts per real assignment (zero-computation
    slots skipped, as the model prices them), the attention's matmuls per s²."""
    model = cpu_model()
    oracle, bmm, assignments, step = counted(model, skip_zero=True)
    slots = LENGTH * spec.measured.routed_slots
    assert 0 < assignments < slots  # the tiny router sends some slots to each kind of expert
    priced = spec.with_routed_fraction(assignments / slots)
    ours = {k: v * LENGTH for k, v in priced.c_lin_by_component.items() if v}
    assert set(ours) == set(oracle), (ours, oracle)
    for key, value in oracle.items():
        assert ours[key] == pytest.approx(3 * value, rel=1e-3), key
    assert spec.c_assignment * assignments == 3 * oracle["moe_routed"]  # exactly, per assignment
    assert spec.c_core_by_kind["full"] * LENGTH**2 == pytest.approx(1.5 * bmm, rel=1e-3)
    # the whole step: the GEMMs, and the eager matmuls over all s² pairs (the count's s²/2, twice)
    gemms = (spec.c_lin_fixed + priced.c_lin_by_component["moe_routed"]) * LENGTH
    assert gemms + 2 * spec.c_core_by_kind["full"] * LENGTH**2 == pytest.approx(step, rel=1e-3)


def test_transformers_runs_every_slot_through_a_real_expert(spec):
    """As transformers runs it, a slot routed to a zero-computation expert goes through a real
    expert at weight 0: the experts' GEMMs are those of a routed fraction of 1."""
    oracle, _, assignments, _ = counted(cpu_model(), skip_zero=False)
    assert assignments < LENGTH * spec.measured.routed_slots
    executed = spec.with_routed_fraction(1.0).c_lin_by_component["moe_routed"]
    assert executed * LENGTH == pytest.approx(3 * oracle["moe_routed"], rel=1e-3)


def test_without_a_routed_fraction_the_count_says_what_it_needs(spec):
    assert spec.routing_dependent
    with pytest.raises(ValueError, match=r"routed fraction|fraction of top-k slots"):
        _ = spec.c_lin
    with pytest.raises(ValueError, match="fraction of top-k slots"):
        spec.flops_by_kind(10, {"seqlen_sq_sum_thd": 100, "seqlen_sq_sum_bshd": 100})
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match="from 0 to 1"):
            spec.with_routed_fraction(bad)
    other = spec_from_structure({**LONGCAT, "zero_expert_num": 0})
    assert not other.routing_dependent and other.c_lin_by_component["moe_routed"]
    with pytest.raises(ValueError, match="no zero-computation experts"):
        other.with_routed_fraction(0.5)


def test_the_assignment_price_survives_the_wire_dict(spec):
    again = ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and again.routing_dependent
    assert (again.c_assignment, again.measured.routed_slots) == (spec.c_assignment, spec.measured.routed_slots)
    plain = spec_from_structure({**LONGCAT, "zero_expert_num": 0}).to_dict()
    assert set(plain["measured"]) == {"c_lin", "c_core"}  # other models' dicts are unchanged


FIXTURE = Path(__file__).parent.parent / "fixtures" / "hf" / "structural" / "longcat_flash.json"


def test_the_published_widths_on_meta_by_hand():
    """LongCat-Flash's published widths (transformers' LongcatFlashConfig defaults, with the keys its
    checkpoints carry), built on the meta device, against the shapes written out by hand."""
    cfg = json.loads(FIXTURE.read_text())
    spec = spec_from_structure(cfg)
    h, n, layers, e, top_k = 6144, 64, 28, 2048, 12
    q_lora, kv_lora, nope, rope, v = 1536, 512, 128, 64, 128
    mla = h * q_lora + q_lora * n * (nope + rope) + h * (kv_lora + rope) + kv_lora * n * (nope + v) + n * v * h
    assert spec.c_lin_fixed_by_component == {
        **dict.fromkeys(spec.c_lin_fixed_by_component, 0),
        "attention": 6 * 2 * mla * layers,  # two MLA attentions a layer
        "dense_mlp": 6 * 2 * 3 * h * 12288 * layers,  # two dense SwiGLU MLPs a layer
        "logits": 6 * h * 131072,
    }
    assert spec.c_core_by_kind == {"full": 3 * 2 * n * (nope + rope + v) * layers}
    assert (spec.c_assignment, spec.measured.routed_slots) == (6 * 3 * h * e, top_k * layers)
    doc = " ".join((Path(__file__).parents[2] / "docs" / "flops.md").read_text().split())
    fixed = spec.c_lin_fixed_by_component
    worked = (
        f"c_lin_fixed = {spec.c_lin_fixed:,} FLOPs per token (attention {fixed['attention']:,}, dense MLPs "
        f"{fixed['dense_mlp']:,}, logits {fixed['logits']:,}), c_assignment = {spec.c_assignment:,} per assignment, "
        f"routed_slots = {spec.measured.routed_slots}, c_core = {spec.c_core_by_kind['full']:,}; at F = 1, C_lin = "
        f"{spec.with_routed_fraction(1).c_lin:,}, at F = 0.5, {spec.with_routed_fraction(0.5).c_lin:,}"
    )
    assert worked in doc  # docs/flops.md's worked value, "Zero-computation experts"
    with pytest.raises(HFConfigError, match="'zero_expert_type' is 'none'"):
        spec_from_structure({**cfg, "zero_expert_type": "none"})


def test_the_cli_needs_a_routed_fraction_and_agrees_with_the_python_api(tmp_path, capsys):
    from packscope.agent import read_any_hf_config, spec_from_any_hf_config
    from packscope.commands.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(LONGCAT))
    args = ["flops", "--hf-config", str(path), "--pack", "3,9,4", "--pack-length", "16"]
    assert main(args) == 2
    assert "give --routed-fraction F" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--routed-fraction", "1.5"])
    assert "from 0 to 1" in capsys.readouterr().err
    assert main([*args, "--routed-fraction", "0.25"]) == 0
    out = json.loads(capsys.readouterr().out)
    cfg = dict(LONGCAT)
    loaded = cpu_model().config
    for spec in (read_any_hf_config(path, routed_fraction=0.25), spec_from_any_hf_config(loaded, routed_fraction=0.25)):
        assert out["c_lin_by_component"] == {k: v for k, v in spec.c_lin_by_component.items() if v}
        assert out["flops_thd"] == spec.triad_by_kind(16, 16, out["sums"])["thd"]
    fixed = spec_from_structure(cfg)
    assert out["c_lin_by_component"]["moe_routed"] == round(0.25 * fixed.measured.routed_slots * fixed.c_assignment)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({**LONGCAT, "zero_expert_num": 0}))
    assert main(["flops", "--hf-config", str(plain), "--pack", "4", "--routed-fraction", "0.5"]) == 2
    assert "no zero-computation experts" in capsys.readouterr().err


def _train_with_callback(gradient_checkpointing: bool) -> tuple[Any, list[torch.Tensor], list[int]]:
    """Four optimizer steps of two micro-batches of the tiny model in the HF Trainer with the
    callback, two steps an interval; the routers' own assignments of every training forward."""
    datasets = pytest.importorskip("datasets")
    import transformers

    from packscope.agent.integrations.hf import PackscopeCallback

    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(2, 30, (24,), generator=g).tolist()
    data = datasets.Dataset.from_dict(
        {"input_ids": [torch.randint(3, 64, (k,), generator=g).tolist() for k in lengths]}
    )
    model = cpu_model()
    args = transformers.TrainingArguments(
        output_dir="hf-test",
        per_device_train_batch_size=3,
        gradient_accumulation_steps=2,
        max_steps=4,
        logging_steps=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        gradient_checkpointing=gradient_checkpointing,
    )
    callback = PackscopeCallback(run_name="hf-longcat", server=None, spool_dir="runs")
    collator = transformers.DataCollatorWithFlattening()
    with real_assignments(model) as found:
        transformers.Trainer(
            model=model, args=args, data_collator=collator, callbacks=[callback], train_dataset=data
        ).train()
        forwards = list(found)
    return callback, forwards, lengths


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_callbacks_record_counts_the_routing_and_equals_the_api_at_that_fraction(in_tmp, spec):
    """The record's expert_assignments are the routers' own, interval by interval, and its FLOPs
    are those the Python API and the CLI's reader give at the routed fraction they make."""
    from packscope.agent import read_any_hf_config

    callback, forwards, _ = _train_with_callback(gradient_checkpointing=False)
    records = list(callback.agent.records)
    assert len(records) == 2
    per_interval = 2 * 2 * 2  # steps x micro-batches x MoE layers
    path = in_tmp / "config.json"
    path.write_text(json.dumps(LONGCAT))
    for i, r in enumerate(records):
        assignments = int(sum(forwards[i * per_interval : (i + 1) * per_interval]))
        assert r["expert_assignments"] == assignments
        fraction = assignments / (r["tokens"] * spec.measured.routed_slots)
        sums = {k: r[k] for k in ("seqlen_sq_sum_thd", "seqlen_sq_sum_bshd")}
        for other in (read_any_hf_config(path, routed_fraction=fraction), spec.with_routed_fraction(fraction)):
            expected = other.triad_by_kind(r["tokens"], r["real_tokens"], sums)
            for view in ("bshd", "thd"):  # the API's routed work per token is rounded to the FLOP
                assert abs(r[f"flops_{view}"] - expected[view]) <= r["tokens"] / 2


def test_gradient_checkpointing_counts_each_training_forward_once(in_tmp):
    """Checkpointing re-runs each layer's forward in the backward, routers included: those are not
    counted again."""
    plain, forwards, _ = _train_with_callback(gradient_checkpointing=False)
    again, rerun, _ = _train_with_callback(gradient_checkpointing=True)
    assert len(rerun) == 2 * len(forwards)  # every router ran again in the backward
    first = [r["expert_assignments"] for r in plain.agent.records]
    assert first == [r["expert_assignments"] for r in again.agent.records]
    assert sum(first) == int(sum(forwards))


def test_an_agent_of_its_own_counts_the_routing_it_was_given_and_says_when_it_was_not(spec):
    """A trainer without the HF callback: Agent.count_routing(model) before training; without it
    the first interval's end names it. Evaluation forwards are not counted."""
    from packscope.agent import Agent, AgentConfig

    model = cpu_model()
    ids = torch.randint(0, 96, (2, 16))

    def steps(agent: Agent, n: int) -> None:
        for _ in range(n):
            agent.step_begin()
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)  # an evaluation forward between steps
            agent.observe_batch(shape=(2, 16))
            agent.step_end()

    agent = Agent(AgentConfig(log_every=2, count_syncs=False), model=spec)
    agent.count_routing(model)
    with real_assignments(model) as found:
        model.train()
        steps(agent, 4)
        agent.close()
    training = [n for i, n in enumerate(found) if (i // 2) % 2 == 0]  # a step: training, then evaluation
    records = list(agent.records)
    assert [r["expert_assignments"] for r in records] == [int(sum(training[:4])), int(sum(training[4:]))]
    assert all(r["flops_thd"] > spec.c_lin_fixed * r["tokens"] for r in records)
    bare = Agent(AgentConfig(log_every=1, count_syncs=False), model=spec)
    with pytest.raises(ValueError, match=r"call Agent.count_routing\(model\)"):
        steps(bare, 1)
    with pytest.raises(ValueError, match="no zero-computation experts"):
        Agent(AgentConfig(count_syncs=False), model=spec.with_routed_fraction(0.5)).count_routing(model)
