"""What the trainer integrations cost: host time inside the HF Trainer, TRL and Lightning callbacks
per optimizer step and per micro-batch, the ATen ops they run there, and (CUDA) the step-time
ratio with the callback switched on and off step by step inside one run.

The batches are the issue's: a Qwen2 model, `DataCollatorWithFlattening` (position_ids), 8
documents of 32-2048 tokens per micro-batch (the same 8 lengths every micro-batch, so every
step has the same shape), gradient accumulation 2, bf16 on CUDA.

    python bench/integration_overhead.py host  [--integrations hf,trl,lightning] [--steps 60] [--out F]
    python bench/integration_overhead.py ratio [--integrations hf,trl,lightning] [--rounds 80] [--variants full,core]

`host` times every call the Trainer makes into the callback (its `on_*` methods) and every hook
the callback puts on the model, with perf_counter, and counts the ATen ops run inside them (a
dispatch mode entered only there, in a second, shorter run). On CPU the model is a stand-in with
the same batches: the Qwen2 embedding and head without decoder layers (`--model stand-in`),
since a 303M forward over 10k tokens takes seconds here and changes nothing the callback does;
on CUDA the 303M model itself (`--model qwen2-303m`), or the same model with a 512-token
sliding window (`--model mistral-303m-window`) or as Qwen2.5-VL's language model with a small
vision tower and one image per document (`--model qwen25vl-303m`, HF Trainer only): the shapes
whose steps once took 9-33 s with the callback (issue 34). Ordinary steps and log-boundary steps are
reported apart.

`ratio` runs one Trainer in rounds of steps, one step a mode, in a seeded fresh order each round:
"off" (no callback), and each of `--variants`: "full", the callback with the agent's sync counter
counting as the default agent does (over one interval in `count_syncs_every`), and "core", the
callback with the counter's debug mode off, so that
the counter's share is told apart in the same sitting; "null" runs nothing, as "off" does (an A/A control:
its ratio is what the estimator gives when nothing differs). An "on" step puts the callback's hook on
the model and takes it away after (so it also pays for that); the sync counter stays installed for
the run, as in a real one, and only its debug mode follows the schedule (`counting_syncs`). Each
step is timed by CUDA events recorded before the callback's first call and after its last. Each
variant's ratio to "off" comes with a bootstrap 95% interval over rounds
(bench/agent_overhead.py's ratio_estimates; target <= 1.001). That interval holds what varies
inside one process; runs of one sitting differed by more (H200, 2026-12-02), so a figure is the
range over several runs, each its own process with its own `--seed`.
On CPU it runs on the host clock with the stand-in: a smoke run of the code path, not a result.
`bench/step_gaps.py` runs the same schedule under torch.profiler, to place an "on" step's extra
time on the GPU's timeline.
`--code-root DIR` imports packscope from another tree (e.g. `git archive <commit> agent packscope
trainer | tar -x -C DIR`), for before/after runs from one checkout.

Prints one JSON object (and writes it to --out).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DOC_LENGTHS = [random.Random(0).randint(32, 2048) for _ in range(8)]  # the same 8 in every micro-batch
ACCUMULATION = 2
LOG_EVERY = 10
# A Qwen2 of about 303M parameters (untied embeddings, 32k vocabulary), the model size.
QWEN2_303M: dict[str, Any] = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=21,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)


def use_code_root(root: str) -> None:
    """Import packscope (and its agent and trainer) from `root` instead of the installed tree."""
    folders = {"packscope": "packscope", "packscope.agent": "agent", "packscope.trainer": "trainer"}

    class Finder:
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name not in folders:
                return None
            folder = Path(root, folders[name])
            return importlib.util.spec_from_file_location(
                name, folder / "__init__.py", submodule_search_locations=[str(folder)]
            )

    sys.meta_path.insert(0, Finder())


# -- the workload ------------------------------------------------------------------------------
STAND_IN_VOCAB = 512  # token ids of the examples are below it, so that both models take them


# The two shapes whose callback once cost 9-33 s a step on an H100 (issue 34): the same text
# model with a sliding window narrower than most documents, and as Qwen2.5-VL's language model
# with a small vision tower, every document opening with one image.
MISTRAL_WINDOW = 512
VISION_TOKENS = (31990, 31991, 31992)  # image, vision start, vision end: inside the vocabulary, above the text ids
IMAGE_GRID = (1, 8, 8)  # one frame of 8x8 patches: 16 tokens after the 2x2 merge
MODELS = ("stand-in", "qwen2-303m", "mistral-303m-window", "qwen25vl-303m")


def make_model(kind: str, device: str):
    import torch
    import transformers

    torch.manual_seed(0)
    # SDPA: the GPU machine has no flash-attn, so torch's own attention kernels.
    model: Any
    if kind == "qwen2-303m":
        config: Any = transformers.Qwen2Config(**QWEN2_303M, attn_implementation="sdpa")  # type: ignore[call-arg]
        model = transformers.Qwen2ForCausalLM(config)
    elif kind == "mistral-303m-window":
        config = transformers.MistralConfig(**QWEN2_303M, sliding_window=MISTRAL_WINDOW, attn_implementation="sdpa")  # type: ignore[call-arg]
        model = transformers.MistralForCausalLM(config)
    elif kind == "qwen25vl-303m":
        image, start, end = VISION_TOKENS
        config = transformers.Qwen2_5_VLConfig(
            text_config={**QWEN2_303M, "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]}},
            vision_config=dict(
                depth=4, hidden_size=256, intermediate_size=512, num_heads=4, out_hidden_size=QWEN2_303M["hidden_size"]
            ),
            image_token_id=image, vision_start_token_id=start, vision_end_token_id=end, attn_implementation="sdpa",
        )  # type: ignore[call-arg]  # fmt: skip
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    else:
        model = stand_in_model()
    return model.to(device)


class VisionFlattening:
    """DataCollatorWithFlattening for Qwen2.5-VL: the micro-batch's examples back to back in one
    row, position_ids restarting at each, each example opened by one image (its pixel patches and
    `image_grid_thw` row). The labels skip the image's tokens."""

    def __call__(self, features: list[dict[str, list[int]]]) -> dict[str, Any]:
        import torch

        image, start, end = VISION_TOKENS
        t, h, w = IMAGE_GRID
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        for f in features:
            doc = [start, *[image] * (t * h * w // 4), end, *f["input_ids"]]
            ids += doc
            labels += [-100] * (len(doc) - len(f["input_ids"]) + 1) + f["input_ids"][1:]
            positions += range(len(doc))
        n = len(features)
        return {
            "input_ids": torch.tensor([ids]),
            "labels": torch.tensor([labels]),
            "position_ids": torch.tensor([positions]),
            "pixel_values": torch.randn(n * t * h * w, 3 * 2 * 14 * 14),
            "image_grid_thw": torch.tensor([IMAGE_GRID] * n),
        }


def stand_in_model():
    """Qwen2ForCausalLM's interface (keyword arguments in, outputs.loss over the shifted labels,
    normalised by num_items_in_batch, out) at a few microseconds of compute: embedding and head
    only, 64 wide over a 512-token vocabulary. The callback sees what it sees in the real model."""
    import transformers
    from transformers.modeling_outputs import CausalLMOutputWithPast

    class StandIn(transformers.Qwen2ForCausalLM):
        def forward(self, input_ids=None, position_ids=None, attention_mask=None, labels=None, **kwargs):
            logits = self.lm_head(self.model.embed_tokens(input_ids))
            loss = None if labels is None else self.loss_function(logits, labels, STAND_IN_VOCAB, **kwargs)
            return CausalLMOutputWithPast(loss=loss, logits=logits)

    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=0, num_attention_heads=4)
    return StandIn(transformers.Qwen2Config(**{**QWEN2_303M, **sizes, "vocab_size": STAND_IN_VOCAB}))


def examples(n: int) -> list[dict[str, list[int]]]:
    rng = random.Random(1)
    return [{"input_ids": [rng.randrange(3, STAND_IN_VOCAB) for _ in range(DOC_LENGTHS[i % 8])]} for i in range(n)]


def flops_spec(model: Any = None):
    """The FLOPs model of `model` (default: the Qwen2 303M), read from its config. The CPU stand-in
    (no decoder layers, which the FLOPs model refuses) is counted as the 303M it stands in for."""
    import transformers

    from packscope.core.hf_config import spec_from_hf_config

    if model is None or getattr(model.config, "num_hidden_layers", None) == 0:
        return spec_from_hf_config(transformers.Qwen2Config(**QWEN2_303M))
    return spec_from_hf_config(model.config)


class Probe:
    """Times (and, when counting, counts the ATen ops of) every call into a callback: its on_*
    methods and the hooks it registers on the model. Calls are grouped by optimizer step."""

    def __init__(
        self, count_ops: bool, profile: Any = None, profiled_step: Callable[[int], bool] | None = None
    ) -> None:
        self.count_ops = count_ops
        self.profile = profile  # a cProfile.Profile that the calls of profiled steps run under, or None
        self.profiled_step = profiled_step or (lambda n: True)
        self.profiled_steps = 0
        self.steps: list[dict[str, float]] = []  # per finished step: host s in events, in hooks; ops
        self._current = self._fresh()
        self._mode: Any = None
        if count_ops:
            from torch.utils._python_dispatch import TorchDispatchMode

            probe = self

            class Count(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    if not getattr(func, "is_view", False):
                        probe._current["ops"] += 1
                        if probe._in_hook:
                            probe._current["hook_ops"] += 1
                    return func(*args, **(kwargs or {}))

            self._mode_cls = Count
        self._in_hook = False

    @staticmethod
    def _fresh() -> dict[str, float]:
        return {"event_s": 0.0, "hook_s": 0.0, "hooks": 0, "ops": 0, "hook_ops": 0}

    def timed(self, fn: Callable[..., Any], hook: bool, closes_step: bool = False) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            mode = self._mode_cls() if self.count_ops else None
            self._in_hook = hook
            t0 = time.perf_counter()
            if mode is not None:
                with mode:
                    out = fn(*args, **kwargs)
            elif self.profile is not None and self.profiled_step(len(self.steps) + 1):
                out = self.profile.runcall(fn, *args, **kwargs)
                self.profiled_steps += closes_step
            else:
                out = fn(*args, **kwargs)
            elapsed = time.perf_counter() - t0
            self._current["hook_s" if hook else "event_s"] += elapsed
            self._current["hooks"] += hook
            if closes_step:
                self.steps.append(self._current)
                self._current = self._fresh()
            return out

        return call

    def wrap_callback(self, callback: Any, step_end: str) -> None:
        for name in dir(type(callback)):
            if name.startswith("on_") and callable(getattr(callback, name)):
                setattr(callback, name, self.timed(getattr(callback, name), hook=False, closes_step=name == step_end))

    def wrap_hooks(self, module: Any) -> None:
        """Hooks the callback registers on `module` are timed too, whatever the callback calls them."""
        for register in ("register_forward_pre_hook", "register_forward_hook"):
            original = getattr(module, register)

            def wrapped(hook: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                return _original(self.timed(hook, hook=True), *args, **kwargs)

            setattr(module, register, wrapped)


def summary(probe: Probe, boundary: Callable[[int], bool], warmup: int) -> dict[str, Any]:
    steps = [(i + 1, s) for i, s in enumerate(probe.steps) if i >= warmup]
    ordinary = [s for n, s in steps if not boundary(n)]
    logging = [s for n, s in steps if boundary(n)]

    def us(values: list[float]) -> dict[str, float]:
        if not values:
            return {}
        low, high = (statistics.quantiles(values, n=10)[::8]) if len(values) >= 10 else (min(values), max(values))
        return {
            "median": 1e6 * statistics.median(values),
            "p10": 1e6 * low,  # the extremes for fewer than 10 values
            "p90": 1e6 * high,
            "mean": 1e6 * statistics.fmean(values),
        }

    micro = [s["hook_s"] / ACCUMULATION for s in ordinary]  # whatever number of hooks a micro-batch has
    return {
        "steps_timed": len(steps),
        "ordinary_steps": len(ordinary),
        "host_us_per_ordinary_step": us([s["event_s"] + s["hook_s"] for s in ordinary]),
        "host_us_per_ordinary_step_in_on_methods": us([s["event_s"] for s in ordinary]),
        "host_us_per_micro_batch_in_hooks": us(micro),
        "host_us_per_log_boundary_step": us([s["event_s"] + s["hook_s"] for s in logging]),
        # every step, boundaries included: what the callback costs the run on average
        "host_us_per_step_all": us([s["event_s"] + s["hook_s"] for _, s in steps]),
        "hooks_per_ordinary_step": statistics.median(s["hooks"] for s in ordinary) if ordinary else None,
    }


def op_counts(probe: Probe, boundary: Callable[[int], bool], warmup: int) -> dict[str, Any]:
    steps = [(i + 1, s) for i, s in enumerate(probe.steps) if i >= warmup]
    ordinary = [s for n, s in steps if not boundary(n)]
    logging = [s for n, s in steps if boundary(n)]
    return {
        "aten_ops_per_ordinary_step": statistics.median(s["ops"] for s in ordinary),
        "aten_ops_per_micro_batch_in_hooks": statistics.median(s["hook_ops"] / ACCUMULATION for s in ordinary),
        "aten_ops_per_log_boundary_step": statistics.median(s["ops"] for s in logging) if logging else None,
    }


# -- the three integrations ---------------------------------------------------------------------
def hf_trainer(model, steps: int, callbacks: list, device: str, trl: bool = False):
    import torch
    import transformers

    data = examples(8 * ACCUMULATION * (steps + 2))
    vision = getattr(model.config, "vision_config", None) is not None
    if vision and trl:
        raise SystemExit("the vision model runs in the HF Trainer only (--integrations hf)")
    common: dict[str, Any] = dict(
        output_dir=str(Path(os.environ.get("TMPDIR", "/tmp")) / "packscope-bench-hf"),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=ACCUMULATION,
        max_steps=steps,
        logging_steps=LOG_EVERY,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=device == "cpu",
        bf16=device == "cuda",
        dataloader_num_workers=0,
        remove_unused_columns=not vision,  # the collator makes the images from the examples' text
    )
    if trl:
        import datasets
        import trl as trl_lib

        args = trl_lib.SFTConfig(**common, packing=True, max_length=sum(DOC_LENGTHS))
        args.per_device_train_batch_size = 1
        return quiet(
            trl_lib.SFTTrainer(
                model=model,
                args=args,
                train_dataset=datasets.Dataset.from_list(data),
                processing_class=tokenizer(),
                callbacks=callbacks,
            )
        )

    class InOrder(transformers.Trainer):
        def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Any:
            dataset: Any = self.train_dataset
            return torch.utils.data.SequentialSampler(dataset)  # every batch the same 8 lengths

    return quiet(
        InOrder(
            model=model,
            args=transformers.TrainingArguments(**common),
            train_dataset=data,
            data_collator=VisionFlattening() if vision else transformers.DataCollatorWithFlattening(),
            callbacks=callbacks,
        )
    )


def quiet(trainer):
    """Without the Trainer's printed log lines: stdout is this bench's JSON."""
    import transformers

    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    return trainer


def tokenizer():
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {"<pad>": 0, **{f"t{i}": i for i in range(1, STAND_IN_VOCAB)}}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t1")), pad_token="<pad>", eos_token="t2"
    )


def lightning_run(model, steps: int, callbacks: list, device: str):
    import lightning.pytorch as L
    import torch
    import transformers

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: dict, batch_idx: int):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-5)

    data: Any = examples(8 * ACCUMULATION * (steps + 2))  # a list serves as a map-style dataset
    loader: Any = torch.utils.data.DataLoader(data, batch_size=8, collate_fn=transformers.DataCollatorWithFlattening())
    trainer = L.Trainer(
        max_steps=steps,
        accumulate_grad_batches=ACCUMULATION,
        log_every_n_steps=LOG_EVERY,
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        precision="bf16-mixed" if device == "cuda" else "32-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    return trainer, Module(), loader


def profile_top(profile: Any, steps: int, n: int = 15) -> list[dict[str, Any]]:
    """The functions that took the most host time inside the callback on ordinary steps (their
    own time, per step; a tensor operator such as `x[1:] == 0` counts as its caller's own time)."""
    import pstats

    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:n]
    return [
        {
            "function": f"{Path(file).name}:{line}({name})",
            "calls_per_step": calls / steps,
            "own_us_per_step": 1e6 * own / steps,
            "cumulative_us_per_step": 1e6 * cumulative / steps,
        }
        for (file, line, name), (_, calls, own, cumulative, _) in rows
    ]


def host_cost(
    integration: str, model_kind: str, steps: int, device: str, count_ops: bool, profile: Any = None
) -> dict[str, Any]:
    import torch

    boundary = lambda n: n % LOG_EVERY == 0  # noqa: E731
    warmup = 2
    model = make_model(model_kind, device)
    probe = Probe(count_ops, profile, profiled_step=lambda n: warmup < n <= steps and not boundary(n))
    agent_settings = dict(
        run_name=f"bench-{integration}", model=flops_spec(model), log_every=LOG_EVERY, sample_gpu=False
    )
    if integration == "lightning":
        from packscope.agent.integrations.lightning import PackscopeCallback as LightningCallback

        callback = LightningCallback(**agent_settings)
        probe.wrap_callback(callback, step_end="on_train_batch_end")
        trainer, module, loader = lightning_run(model, steps, [callback], device)
        probe.wrap_hooks(module)
        # Lightning calls on_train_batch_end per micro-batch: group its calls by optimizer step.
        per_micro = probe.steps
        trainer.fit(module, loader)
        probe.steps = [
            {k: sum(s[k] for s in per_micro[i : i + ACCUMULATION]) for k in per_micro[0]}
            for i in range(0, len(per_micro) - ACCUMULATION + 1, ACCUMULATION)
        ]
    else:
        from packscope.agent.integrations.hf import PackscopeCallback

        hf_callback = PackscopeCallback(**agent_settings)
        probe.wrap_callback(hf_callback, step_end="on_step_end")
        probe.wrap_hooks(model)
        trainer = hf_trainer(model, steps, [hf_callback], device, trl=integration == "trl")
        trainer.train()
    if device == "cuda":
        torch.cuda.synchronize()
    result = {**summary(probe, boundary, warmup), **(op_counts(probe, boundary, warmup) if count_ops else {})}
    if profile is not None:
        result["profile_top_own_time"] = profile_top(profile, probe.profiled_steps)
    return result


# -- the on/off ratio (CUDA) ---------------------------------------------------------------------
class HostEvent:
    """torch.cuda.Event's timing interface on the host clock: the ratio's code path on CPU (a
    smoke run: the stand-in model's step is host work, so its ratio says little)."""

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.t - self.t) * 1e3


def timing_event(device: str) -> Any:
    import torch

    return torch.cuda.Event(enable_timing=True) if device == "cuda" else HostEvent()


# What an "on" step runs: the callback with the agent's sync counter counting (the default agent),
# or the callback alone (the counter installed, its debug mode off): both in one run, so that the
# counter's share of the callback's cost is told apart in one sitting. Two more take the HF
# callback apart: "methods", its on_* methods without its hook on the model (the agent's steps,
# no micro-batch kept), and "hook", its hook alone (every forward kept, dropped at the step's end);
# "null" runs nothing, as "off" does, under another name (an A/A control: the estimator's own spread).
VARIANTS = ("full", "core")
DIAGNOSTIC_VARIANTS = ("methods", "hook", "null")
IDLE_MODES = ("off", "null")  # the modes whose steps run no callback


def round_schedule(modes: tuple[str, ...], rounds: int, seed: int) -> list[str]:
    """Per step: "off", or the variant of the callback it runs; every mode once a round, in a
    seeded fresh order each round."""
    rng = random.Random(seed)
    schedule: list[str] = []
    for _ in range(rounds):
        schedule += rng.sample(modes, len(modes))
    return schedule


def step_time_ratio(
    integration: str,
    rounds: int,
    warmup_rounds: int,
    model_kind: str,
    device: str,
    variants: tuple[str, ...],
    seed: int = 0,
    gc_freeze: bool = False,
) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from agent_overhead import ratio_estimates
    from sync_records import sync_sites, syncs_per_step

    modes = ("off", *variants)
    schedule = round_schedule(modes, warmup_rounds + rounds, seed)
    model = make_model(model_kind, device)
    events: list[tuple[str, Any, Any, bool]] = []  # per step: mode, its two events, whether it read batches
    host_in_callback: list[tuple[str, float]] = []
    pauses = GcPauses()
    # --gc-freeze: after the warm-up rounds, the objects alive then (model, Trainer, optimizer) go to
    # the permanent generation, so a full collection no longer walks them; collections still run.
    freeze_at = len(modes) * warmup_rounds if gc_freeze else None
    settings = dict(
        run_name=f"ratio-{integration}",
        model=flops_spec(model),
        log_every=LOG_EVERY,
        count_syncs="full" in variants,
    )
    if integration in ("hf", "trl"):
        from packscope.agent.integrations.hf import PackscopeCallback

        inner: Any = PackscopeCallback(**settings)
        switch = switched_hf(inner, model, schedule, events, host_in_callback, device, pauses, freeze_at)
        trainer = hf_trainer(model, len(schedule), [switch], device, trl=integration == "trl")
        trainer.train()
    else:
        from packscope.agent.integrations.lightning import PackscopeCallback as LightningCallback

        inner = LightningCallback(**settings)
        switch = switched_lightning(inner, schedule, events, host_in_callback, device)
        trainer, module, loader = lightning_run(model, len(schedule), [switch], device)
        trainer.fit(module, loader)
    if device == "cuda":
        torch.cuda.synchronize()
    pauses.close()
    timed = events[len(modes) * warmup_rounds :]
    gc_ms = pauses.per_step[len(modes) * warmup_rounds :]
    by_round = [
        {mode: s.elapsed_time(e) / 1e3 for mode, s, e, _ in timed[i : i + len(modes)]}
        for i in range(0, len(timed) - len(modes) + 1, len(modes))
    ]
    # The steps whose callback read its kept micro-batches or closed an interval (the agent's
    # work done once per PENDING_FORWARDS micro-batches or per boundary), per round and mode.
    reads = [
        {mode: read for mode, _, _, read in timed[i : i + len(modes)]}
        for i in range(0, len(timed) - len(modes) + 1, len(modes))
    ]
    host = host_in_callback[len(variants) * warmup_rounds :]
    records = list(inner.agent.records) if inner.agent is not None else []
    off = [r["off"] for r in by_round]
    result: dict[str, Any] = {
        "integration": integration,
        "model": model_kind,
        "parameters": sum(p.numel() for p in model.parameters()),
        "rounds": len(by_round),
        "seed": seed,
        "median_step_s": {mode: statistics.median(r[mode] for r in by_round) for mode in modes},
        "variants": {},
        "agent_records": len(records),
        "agent_reported_syncs_per_step": syncs_per_step(records),  # over the intervals it counted
        "agent_reported_sync_sites": dict(sync_sites(records)),
        "steps_ms": [[mode, round(1e3 * r[mode], 4), reads[k][mode]] for k, r in enumerate(by_round) for mode in modes],
        # Per timed step (the order of steps_ms' rows is by round; this is the run's order): the mode
        # and the host time spent in Python's garbage collector during it, in ms.
        "gc_freeze": gc_freeze,
        "gc_ms_by_step": [[mode, round(ms, 3)] for (mode, *_), ms in zip(timed, gc_ms, strict=False)],
    }
    for variant in variants:
        spent = [t for mode, t in host if mode == variant]
        plain = [k for k, r in enumerate(reads) if not r[variant]]
        read = [k for k, r in enumerate(reads) if r[variant]]
        result["variants"][variant] = {
            "ratios": ratio_estimates([r[variant] for r in by_round], off),
            # The same over the rounds where this variant's step only kept references (no reads,
            # no boundary), and what a step that read or closed an interval cost beside its round's off.
            "ratios_ordinary_steps": ratio_estimates([by_round[k][variant] for k in plain], [off[k] for k in plain])
            if len(plain) > 2
            else None,
            "steps_that_read": len(read),
            "read_step_extra_ms": {
                "median": 1e3 * statistics.median(by_round[k][variant] - off[k] for k in read),
                "mean": 1e3 * statistics.fmean(by_round[k][variant] - off[k] for k in read),
            }
            if read
            else None,
            "host_us_in_callback_per_step": {
                "median": 1e6 * statistics.median(spent),
                "mean": 1e6 * statistics.fmean(spent),
            },
        }
    return result


def counting_syncs(inner, on: bool) -> None:
    """The agent's sync counter stays installed for the whole run, as in a real one; only the
    sync debug mode it counts through follows the schedule, so an "off" step runs without it, and
    an "on" step with it where the agent counts (it counts one interval in count_syncs_every).
    (Installing the counter per step, as this bench did before, also re-arms every warning that
    Python shows once per place, since it adds a warnings filter: a cost no real run pays per step.)"""
    import torch

    agent = inner.agent
    # CUPTI's counter has no debug mode to switch: it stays on for every step.
    if agent is not None and agent.syncs.installed and agent.config.sync_backend != "cupti":
        counting = getattr(agent.syncs, "counting", True)  # an agent before sampled counting: always
        torch.cuda.set_sync_debug_mode("warn" if on and counting else 0)


def switched_hf(inner, model, schedule: list[str], events: list, host: list, device: str, pauses=None, freeze_at=None):
    """A TrainerCallback that runs `inner` (hooks included) only on the steps `schedule` says, with
    the sync counter's debug mode on for its "full" steps."""
    from transformers import TrainerCallback

    class Switch(TrainerCallback):
        def __init__(self) -> None:
            self.step = 0
            self.begin: Any = None
            self.spent = 0.0
            self.hooks: list = []
            self.read = False  # this step's callback read kept micro-batches or closed an interval
            self.interval = 0

        def _call(self, name: str, *args: Any, **kwargs: Any) -> None:
            t0 = time.perf_counter()
            getattr(inner, name)(*args, **kwargs)
            self.spent += time.perf_counter() - t0

        def on_train_begin(self, args, state, control, **kwargs):
            inner.on_train_begin(args, state, control, **kwargs)
            counting_syncs(inner, False)
            self.hooks = inner.detach() if hasattr(inner, "detach") else _take_hooks(inner)
            pending = getattr(inner, "_pending", None)
            if pending is not None:  # mark the steps on which the callback reads its kept micro-batches
                observe_step = pending._observe_step

                def observed(step: Any) -> None:
                    self.read = True
                    observe_step(step)

                pending._observe_step = observed
            for register in ("register_forward_pre_hook", "register_forward_hook"):  # time the hooks too
                setattr(model, register, self._timing(getattr(model, register)))

        def _timing(self, register: Any) -> Any:
            def registered(hook: Any, *args: Any, **kwargs: Any) -> Any:
                def timed(*hook_args: Any, **hook_kwargs: Any) -> Any:
                    t0 = time.perf_counter()
                    out = hook(*hook_args, **hook_kwargs)
                    self.spent += time.perf_counter() - t0
                    return out

                return register(timed, *args, **kwargs)

            return registered

        def on_step_begin(self, args, state, control, **kwargs):
            if self.step == freeze_at:
                gc.collect()
                gc.freeze()
            if pauses is not None:
                pauses.step_begins()
            self.begin = timing_event(device)
            self.begin.record()
            self.spent = 0.0
            self.read = False
            self.interval = getattr(inner.agent, "_interval", 0)
            mode = schedule[self.step]
            if mode not in IDLE_MODES:
                t0 = time.perf_counter()
                counting_syncs(inner, mode == "full")
                if mode != "methods":
                    inner.attach(model) if hasattr(inner, "attach") else _put_hooks(inner, model, self.hooks)
                self.spent += time.perf_counter() - t0
                if mode != "hook":
                    self._call("on_step_begin", args, state, control, **kwargs)

        def on_optimizer_step(self, args, state, control, **kwargs):
            if schedule[self.step] not in (*IDLE_MODES, "hook"):
                self._call("on_optimizer_step", args, state, control, **kwargs)

        def on_step_end(self, args, state, control, **kwargs):
            mode = schedule[self.step]
            if mode == "null":
                host.append((mode, 0.0))
            elif mode != "off":
                if mode != "hook":
                    self._call("on_step_end", args, state, control, **kwargs)
                t0 = time.perf_counter()
                if mode == "hook":
                    inner._forwards = []  # what on_step_end would hand to the agent: dropped
                inner.detach() if hasattr(inner, "detach") else _take_hooks(inner)
                counting_syncs(inner, False)
                self.spent += time.perf_counter() - t0
                host.append((mode, self.spent))
            end = timing_event(device)
            end.record()
            self.read = self.read or getattr(inner.agent, "_interval", 0) != self.interval
            events.append((mode, self.begin, end, self.read))
            self.step += 1

        def on_train_end(self, args, state, control, **kwargs):
            inner.on_train_end(args, state, control, **kwargs)

    return Switch()


class GcPauses:
    """The host time Python's garbage collector takes during each step (gc.callbacks): a pause
    inside a step whose GPU waits on the host (a model that synchronizes mid-step) lengthens it."""

    def __init__(self) -> None:
        self.per_step: list[float] = []  # ms per step, in the run's order
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def step_begins(self) -> None:
        self.per_step.append(0.0)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self.per_step:
            self.per_step[-1] += 1e3 * (time.perf_counter() - self._started)

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


def _take_hooks(inner) -> list:
    """The hooks of a callback without attach/detach (packscope before this bench): remove them."""
    for handle in inner._hooks:
        handle.remove()
    inner._hooks = []
    return []


def _put_hooks(inner, model, _unused) -> None:
    """The two hooks of packscope before attach/detach (a --code-root run of an older tree)."""
    inner._hooks = [
        model.register_forward_pre_hook(inner._observe, with_kwargs=True),
        model.register_forward_hook(inner._keep_loss, with_kwargs=True),
    ]


def switched_lightning(inner, schedule: list[str], events: list, host: list, device: str):
    """A Lightning Callback that runs `inner` only on the optimizer steps `schedule` says, with the
    sync counter's debug mode on for its "full" steps."""
    import lightning.pytorch as L

    class Switch(L.Callback):
        def __init__(self) -> None:
            self.step = 0
            self.micro = 0
            self.begin: Any = None
            self.spent = 0.0

        def _call(self, name: str, *args: Any) -> None:
            t0 = time.perf_counter()
            getattr(inner, name)(*args)
            self.spent += time.perf_counter() - t0

        def on_train_start(self, trainer, pl_module):
            inner.on_train_start(trainer, pl_module)
            counting_syncs(inner, False)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self.micro == 0:
                self.begin = timing_event(device)
                self.begin.record()
                self.spent = 0.0
            if schedule[self.step] != "off":
                if self.micro == 0:
                    counting_syncs(inner, schedule[self.step] == "full")
                self._call("on_train_batch_start", trainer, pl_module, batch, batch_idx)

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            if schedule[self.step] != "off":
                self._call("on_before_optimizer_step", trainer, pl_module, optimizer)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            mode = schedule[self.step]
            if mode != "off":
                self._call("on_train_batch_end", trainer, pl_module, outputs, batch, batch_idx)
            self.micro += 1
            if self.micro == ACCUMULATION:
                end = timing_event(device)
                end.record()
                events.append((mode, self.begin, end, False))  # (its reads are not marked)
                if mode != "off":
                    counting_syncs(inner, False)
                    host.append((mode, self.spent))
                self.micro = 0
                self.step += 1

        def on_train_end(self, trainer, pl_module):
            inner.on_train_end(trainer, pl_module)

    return Switch()


# -- the command ---------------------------------------------------------------------------------
def emit(result: dict[str, Any], out: str | None) -> None:
    """Print a result as JSON, and write it to `out` too when given (this file's benches and those
    that import from it)."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


def print_table(path: Path) -> None:
    """One line per integration of a result file."""
    result = json.loads(path.read_text())
    for name, r in result.items():
        if name.startswith("gaps_"):  # bench/step_gaps.py's
            from step_gaps import print_table as print_gaps

            print_gaps(path, name, r)
        elif isinstance(r, dict) and "host_us_per_ordinary_step" in r:
            print(
                f"{path.stem} {name}: {r['host_us_per_ordinary_step'].get('median', 0):.0f} us/step "
                f"({r['host_us_per_ordinary_step_in_on_methods'].get('median', 0):.0f} in on_* methods, "
                f"{r['host_us_per_micro_batch_in_hooks'].get('median', 0):.0f} per micro-batch in hooks), "
                f"{r.get('aten_ops_per_ordinary_step')} ATen ops/step, "
                f"{r['host_us_per_log_boundary_step'].get('median', 0):.0f} us at a boundary"
            )
        elif isinstance(r, dict) and "variants" in r:
            for variant, v in r["variants"].items():
                paired = v["ratios"]["paired"]
                low, high = paired["ci95"]
                print(
                    f"{path.stem} {name} {variant}: on/off step time {paired['ratio']:.4f} [{low:.4f}, {high:.4f}] "
                    f"over {r['rounds']} rounds, median step off {r['median_step_s']['off'] * 1e3:.1f} ms, "
                    f"{v['host_us_in_callback_per_step']['median']:.0f} us in the callback per step"
                )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["host", "ratio", "table"])
    ap.add_argument("files", nargs="*", help="table: result files to summarise")
    ap.add_argument("--integrations", default=None, help="comma-separated: hf, trl, lightning")
    ap.add_argument("--steps", type=int, default=60, help="host: optimizer steps per run")
    ap.add_argument("--op-steps", type=int, default=24, help="host: steps of the op-counting run")
    ap.add_argument("--rounds", type=int, default=80, help="ratio: timed rounds (one step off, one per variant)")
    ap.add_argument("--warmup-rounds", type=int, default=8)
    ap.add_argument(
        "--seed",
        type=int,
        default=0,
        help="ratio: the seed of the rounds' order; one run's interval holds only what varies inside the "
        "process (docs/benchmarks/2026-12-02-h200.md), so a figure takes several runs with different seeds",
    )
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="ratio: comma-separated, of full (the default agent: the sync counter counting) and core "
        "(the counter's debug mode off), to tell the counter's share; for hf and trl also methods (the "
        "callback's on_* methods, no hook), hook (its hook alone) and null (an A/A control: no callback, "
        "as off)",
    )
    ap.add_argument(
        "--model",
        choices=MODELS,
        default=None,
        help="default: qwen2-303m on CUDA, stand-in on CPU; mistral-303m-window and qwen25vl-303m (HF Trainer "
        "only) are the windowed and vision shapes",
    )
    ap.add_argument("--code-root", default=None, help="import packscope from this tree (before/after runs)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads on CPU")
    ap.add_argument(
        "--gc-freeze",
        action="store_true",
        help="ratio (hf, trl): gc.freeze() after the warm-up rounds, so that a full collection does not "
        "walk the model's and Trainer's objects inside a timed step",
    )
    ap.add_argument("--profile", action="store_true", help="host: add a cProfile of the callback's calls")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.mode == "table":
        for path in args.files:
            print_table(Path(path))
        return 0
    if args.code_root:
        use_code_root(args.code_root)
    import torch

    import packscope.agent

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(args.threads)
    result: dict[str, Any] = {
        "bench": "integration_overhead",
        "mode": args.mode,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "packscope_agent": str(Path(packscope.agent.__file__).parent),
        "doc_lengths": DOC_LENGTHS,
        "tokens_per_micro_batch": sum(DOC_LENGTHS),
        "gradient_accumulation": ACCUMULATION,
        "log_every": LOG_EVERY,
    }
    if args.mode == "host":
        model = args.model or ("qwen2-303m" if device == "cuda" else "stand-in")
        result["model"] = model
        for name in (args.integrations or "hf,trl,lightning").split(","):
            print(f"host cost: {name} ...", file=sys.stderr)
            timed = host_cost(name, model, args.steps, device, count_ops=False)
            counted = host_cost(name, model, args.op_steps, device, count_ops=True)
            result[name] = {**timed, **{k: v for k, v in counted.items() if k.startswith("aten_ops")}}
            if args.profile:  # the ordinary steps' calls only, in a run of their own
                profiled = host_cost(name, model, args.op_steps, device, count_ops=False, profile=cProfile.Profile())
                result[name]["profile_top_own_time"] = profiled["profile_top_own_time"]
    else:
        model = args.model or ("qwen2-303m" if device == "cuda" else "stand-in")
        for name in (args.integrations or "hf,trl,lightning").split(","):
            print(f"step-time ratio: {name} ...", file=sys.stderr)
            variants = tuple(args.variants.split(","))
            known = VARIANTS + (DIAGNOSTIC_VARIANTS if name in ("hf", "trl") else ())
            if not variants or set(variants) - set(known):
                ap.error(f"--variants for {name} takes a comma-separated list of {', '.join(known)}")
            result[f"ratio_{name}"] = step_time_ratio(
                name, args.rounds, args.warmup_rounds, model, device, variants, args.seed, args.gc_freeze
            )
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
