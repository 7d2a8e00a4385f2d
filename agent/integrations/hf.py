"""packscope in the Hugging Face ``Trainer`` (and TRL's ``SFTTrainer``, a subclass)::

    trainer = SFTTrainer(..., callbacks=[PackscopeCallback(server="http://packscope:8000", run_name="sft")])

* The FLOPs model comes from ``model.config`` (``spec_from_any_hf_config``: the hand-written reader,
  else the model's own structure), unless ``model=`` gives one.
* One agent step per optimizer step: ``on_step_begin`` / ``on_step_end`` (gradient accumulation
  included). Intervals default to the Trainer's ``logging_steps``.
* Every training micro-batch is seen by a forward hook on the model, which keeps the keyword
  arguments the Trainer passes (``batches.observe_kwargs``): ``cu_seq_lens_q`` (TRL padding-free
  and packing, ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``), ``position_ids``
  (``DataCollatorWithFlattening``), ``attention_mask`` (padded rows) or the tokens' shape; and
  the towers' inputs beside them: a vision model's image grids or sizes (``batches.image_kwargs``),
  an omni model's clip masks (``batches.audio_kwargs``: ``feature_attention_mask``,
  ``input_features_mask``), counted on the device at the boundary (docs/flops.md). Forwards in
  eval mode or without autograd (evaluation, TRL's metrics-only second forward) are not counted.
* The loss is the step's token-weighted mean on this rank, from the model's ``outputs.loss``, the
  micro-batch's labels and its ``num_items_in_batch`` (a forward hook): what the Trainer and TRL
  log whenever they normalise by ``num_items_in_batch``. When a custom ``compute_loss_func`` or
  label smoothing computes the loss outside the model, there is none.
* The learning rate is read from the optimizer before the scheduler steps, as the Trainer logs it.
* At train begin, on the CPU, a tiny copy of the model says whether packed documents attend to
  each other in each batch form (``cross_documents.py``; docs/flops.md, "Attention across
  documents"). A form that crosses is a warning in the log and on the run page, and where the
  attention masks let its documents meet, its batches' attention is counted whole-row
  (``observe_batch(whole_row_attention=True)``); a crossing through a layer's state alone is not.

What a step costs: one forward hook keeps a reference to each training forward's arguments and
loss; the steps' forwards are read (their batch form, labels, num_items_in_batch) in one loop
once an interval has ended, or once 16 micro-batches are kept (``batches.PendingSteps``; at once
for a batch with ``inputs_embeds`` or images), and the interval's document lengths and loss are
computed there too, all of its micro-batches together (``integrations/losses.py``). No kernel
runs on an ordinary step. So, as for cu_seqlens batches, the Trainer's tensors must not be
modified in place before the interval ends (its fresh batches never are).

Where that reading runs: the Trainer reads every micro-batch's loss back (its NaN/Inf check), so
when a step ends the GPU is idle and host work there adds to the step. The reading and the
interval's reduction (``Agent.defer_boundary``) run instead in the forward hook of the next
training forward, when the GPU has that forward's kernels queued. (On the H200, 2026-12-03, the
step-time ratio did not move beyond the runs' noise with it:
docs/benchmarks/2026-12-03-h200.md#h200-2026-12-03-afternoon.)

The host syncs that the agent reports are the Trainer's own (e.g. its NaN/Inf check of every
micro-batch's loss with ``logging_nan_inf_filter``): a finding, not the agent's doing.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler

from packscope.agent.agent import Agent
from packscope.agent.config import AgentConfig
from packscope.agent.hf_structure import spec_from_any_hf_config
from packscope.agent.integrations.batches import (
    HEAVY_KEYS,
    PendingSteps,
    audio_kwargs,
    image_kwargs,
    observe_kwargs,
    shapes_of_heavy,
)
from packscope.agent.integrations.cross_documents import (
    CROSSED,
    KEPT,
    CrossDocumentCheck,
    Verdict,
    check_common_forms,
    form_of,
)
from packscope.agent.integrations.losses import TokenWeightedLoss
from packscope.agent.integrations.trainer_logs import TrainerLogs
from packscope.core.flops import ModelSpec

log = logging.getLogger("packscope.agent")


def _run_first(callback: TrainerCallback, caller: Any) -> None:
    """Moves `callback` to the front of the Trainer's callbacks, found as the `self` of the
    CallbackHandler.call_event that called on_train_begin (`caller`, its frame): the Trainer puts
    the reporting callbacks (W&B, TensorBoard, MLflow) before the user's, and each gets the same
    `logs` dict in turn, so values added after them would reach none. The loop in progress is
    unaffected (the callbacks after this one keep their places)."""
    handler = caller.f_locals.get("self")
    if isinstance(handler, CallbackHandler) and callback in handler.callbacks:
        handler.callbacks.remove(callback)
        handler.callbacks.insert(0, callback)
    else:
        log.warning(
            "packscope: could not put the callback before the Trainer's reporting callbacks; "
            "its values reach the Trainer's logs after them"
        )


Forward = tuple[tuple, dict, Any]  # one training forward: (args, kwargs, its loss detached or None)


class PackscopeCallback(TrainerCallback):
    """``callbacks=[PackscopeCallback(server=..., run_name=...)]``; other keyword arguments go to
    :class:`AgentConfig` (``log_every`` defaults to the Trainer's ``logging_steps``, ``config``
    to its arguments, ``start_step`` to the step it resumes from). ``tp`` pads the vocabulary as
    a tensor-parallel trainer would (docs/flops.md). ``log_to_trainer`` (default True) adds
    useful TFLOP/s, MFU and the largest loss to the Trainer's ``logs`` (integrations/trainer_logs.py);
    False leaves them alone."""

    def __init__(
        self,
        server: str | None = None,
        run_name: str = "run",
        *,
        model: ModelSpec | None = None,
        tp: int = 1,
        check_cross_documents: bool = True,
        log_to_trainer: bool = True,
        **config: Any,
    ) -> None:
        self.agent_config = dict(server=server, run_name=run_name, **config)
        self.model_spec = model
        self.tp = tp
        # Whether packed documents attend to each other, on a small copy of the model (built at
        # train begin, cross_documents.py); the verdicts told and the one the run page shows.
        self.check_cross_documents = check_cross_documents
        self.cross_check: CrossDocumentCheck | None = None
        self._told_forms: set[tuple[str, ...]] = set()
        self._shown_verdict: Verdict | None = None
        self.log_to_trainer = log_to_trainer
        self._trainer_logs: TrainerLogs | None = None
        self.agent: Agent | None = None
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        self._losses = TokenWeightedLoss()  # the micro-batches' losses, by reference until the boundary
        self._forwards: list[Forward] = []  # this step's training forwards
        # The ended steps' forwards, until observed (in the next forward's hook, once 16 are kept).
        self._pending = PendingSteps[list[Forward]](self._observe_step, observe_full_at_step_end=False)
        self._lr: float | None = None
        self._warned_unknown = False
        # Set at a step's end when the next training forward has work to do first (an ended
        # interval to reduce, a full store to read): the hook reads one flag, not two objects.
        self._work_waiting = False

    # -- training starts and ends --------------------------------------------------------
    def _running(self) -> Agent:
        if self.agent is None:
            raise RuntimeError("PackscopeCallback: the agent starts in on_train_begin, which has not run")
        return self.agent

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("PackscopeCallback: the Trainer passed no model to on_train_begin")
        spec = self.model_spec or spec_from_any_hf_config(model.config, tp=self.tp)
        if self.check_cross_documents:  # once, on the CPU, before the first step
            self.cross_check = check_common_forms(model)
        settings = dict(self.agent_config)
        settings.setdefault("log_every", max(1, int(state.logging_steps or 10)))
        settings.setdefault("start_step", state.global_step)
        settings.setdefault("config", args.to_sanitized_dict())
        if getattr(args, "packing", False) and getattr(args, "max_length", None) and "pack_length" not in settings:
            # TRL hands its packs to the model flattened into one row: count them as its packs.
            settings.update(pack_length=int(args.max_length), pack_length_from="TRL max_length (packing=True)")
        self.agent = Agent(AgentConfig(**settings), model=spec, device=args.device)
        self.agent.announce()
        self.agent.interval_loss = self._losses.interval_mean
        self.agent.before_boundary = self._pending.observe
        self.agent.defer_boundary = True  # reduced in the next forward's hook (_keep_forward)
        self.attach(model)
        if self.log_to_trainer:
            self._trainer_logs = TrainerLogs(self.agent)
            _run_first(self, sys._getframe(1))

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The intervals whose records the agent emitted since the last log (usually the one before
        # this log's: a record is emitted once its copy has landed); host floats, no sync.
        if self._trainer_logs is not None and logs is not None:
            logs.update(self._trainer_logs.take())

    def attach(self, model: torch.nn.Module) -> None:
        """Put the hook that sees every micro-batch on `model` (on_train_begin does)."""
        self.detach()
        self._hooks = [model.register_forward_hook(self._keep_forward, with_kwargs=True)]
        if self.agent is not None and self.agent.model.routing_dependent:  # zero-computation experts
            self.agent.count_routing(model)  # the routed work is the routing's: counted on the device

    def detach(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def on_train_end(self, args, state, control, **kwargs):
        self.detach()  # the agent's close observes the kept steps (before_boundary)
        if self.agent is not None:
            self.agent.close()

    # -- one optimizer step ---------------------------------------------------------------
    def on_step_begin(self, args, state, control, **kwargs):
        self._forwards = []
        self._running().step_begin()

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        lr = optimizer.param_groups[0]["lr"] if optimizer is not None else None
        # A device tensor lr would need a read; leave it to the Trainer's own log.
        self._lr = float(lr) if isinstance(lr, (int, float)) else None

    def on_step_end(self, args, state, control, **kwargs):
        agent = self._running()
        agent.finish_boundary()  # a step without a training forward: the last interval's steps first
        self._pending.end_step(self._forwards, len(self._forwards))
        self._forwards = []
        agent.step_end(lr=self._lr)  # a boundary takes its host facts; the reading waits for the next forward
        self._work_waiting = agent.boundary_waiting or self._pending.full

    # -- every micro-batch: a reference kept, read at the boundary ---------------------------
    # Keeping a forward's arguments holds what the accumulator and the losses keep anyway (the
    # positions, the labels) and the token ids; the Python work of reading them runs in one warm
    # loop for many micro-batches (PendingSteps) instead of between the Trainer's forwards.
    def _keep_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not (module.training and torch.is_grad_enabled()):  # evaluation, a metrics-only forward
            return
        if self._work_waiting:
            self._do_waiting_work()
        loss = getattr(output, "loss", None)  # not the output: its logits
        if not HEAVY_KEYS.isdisjoint(kwargs):  # images, audio features or embeddings: kept as their shapes only
            kwargs = shapes_of_heavy(kwargs)
        # Detached now: a forward without a backward would hold its graph, activations and all.
        self._forwards.append((args, kwargs, loss.detach() if isinstance(loss, torch.Tensor) else None))

    def _do_waiting_work(self) -> None:
        # The GPU has this forward's kernels queued: the deferred reading runs beside them, not in
        # the idle gap after the Trainer's NaN check (module docstring).
        self._work_waiting = False
        self._running().finish_boundary()
        if self._pending.full:
            self._pending.observe()

    def _observe_step(self, forwards: list[Forward]) -> None:
        agent = self._running()
        for forward_args, forward_kwargs, loss in forwards:
            self._observe_batch(agent, forward_args, forward_kwargs)
            self._keep_loss_of(loss, forward_kwargs)
        self._losses.end_step()

    def _observe_batch(self, agent: Agent, args: tuple, kwargs: dict) -> None:
        batch = kwargs if args == () else {"input_ids": args[0], **kwargs}
        form = observe_kwargs(batch)
        if form is None:
            if not self._warned_unknown:
                log.warning("packscope: a training forward had no input_ids/inputs_embeds; not counted")
                self._warned_unknown = True
            return
        packed = form_of(batch) if self.cross_check is not None else None
        # Whole rows where the masks let documents meet; a crossing through a layer's state alone
        # leaves the attention work per document.
        whole_rows = packed is not None and self._verdict(agent, packed).whole_rows
        towers = {**image_kwargs(batch, agent.model.vision), **audio_kwargs(batch, agent.model.audio)}
        agent.observe_batch(**form, **towers, whole_row_attention=whole_rows)

    def _verdict(self, agent: Agent, packed: tuple[str, ...]) -> Verdict:
        """The check's verdict for a packed batch form; said once per form when first seen (in the
        deferred reading, never between forwards): a crossing as a warning, for the trainer's log
        and the run page (the worst verdict seen so far)."""
        assert self.cross_check is not None
        verdict = self.cross_check.verdict(packed)  # computed here on first sight of an unusual form
        if packed in self._told_forms:
            return verdict
        self._told_forms.add(packed)
        if verdict.whole_rows:
            log.warning(
                "packscope: %s. This is a training bug: each document should attend only to itself. Use a "
                "batch form or attention implementation that keeps documents apart (e.g. position_ids "
                "without an attention mask on a model whose masks read them, or flash-attention with "
                "cu_seq_lens). packscope counts the whole-row attention these batches do.",
                verdict.detail,
            )
        elif verdict.crossed:
            log.warning(
                "packscope: %s. This is a training bug: each document should see only itself. A linear-"
                "attention or convolutional layer keeps documents apart only with kernels that read their "
                "boundaries (e.g. flash-linear-attention and causal-conv1d given cu_seq_lens). packscope "
                "counts these batches' attention per document, the work their masks let through.",
                verdict.detail,
            )
        else:
            log.info("packscope: cross-document check: %s: %s", verdict.status, verdict.detail)
        rank = {CROSSED: 2, KEPT: 0}
        shown = self._shown_verdict
        if shown is None or rank.get(verdict.status, 1) > rank.get(shown.status, 1):
            self._shown_verdict = verdict
            agent.tell_cross_documents(verdict.status, verdict.detail)
        return verdict

    def _keep_loss_of(self, loss: Any, kwargs: dict) -> None:
        labels = kwargs.get("shift_labels")
        shifted = labels is not None
        if not shifted:
            labels = kwargs.get("labels")
        if not (isinstance(loss, torch.Tensor) and isinstance(labels, torch.Tensor)):
            return
        # HF's causal-LM loss predicts labels[..., 1:] (unless given shift_labels) and ignores -100.
        # It is a mean over its own targets or, given num_items_in_batch, the micro-batch's summed
        # loss divided by that step-wide count; kept by reference, weighed at the boundary.
        self._losses.add(loss, labels, shifted=shifted, divisor=kwargs.get("num_items_in_batch"))
