"""packscope in PyTorch Lightning::

    trainer = L.Trainer(..., callbacks=[PackscopeCallback(server="http://packscope:8000", run_name="sft")])

* One agent step per optimizer step (``accumulate_grad_batches`` included): a step opens at the
  first micro-batch after an optimizer step and closes at the end of the batch in which
  ``on_before_optimizer_step`` ran.
* Every training batch is read by ``batch_to_form(batch) -> dict of observe_batch arguments``.
  The default reads a dict batch by its keys (``batches.observe_kwargs``): ``cu_seqlens``
  [+ ``cu_seqlens_padded``, ``token_mask``] with the shape of ``input_ids``/``tokens``,
  ``position_ids`` [+ ``attention_mask``], ``attention_mask``, or the tokens' shape. Give your
  own for any other batch; returning None skips the batch.
* The FLOPs model is ``model=`` (a ``ModelSpec``, a ``transformers`` config or a dict), else the
  Hugging Face config found at ``pl_module.config`` or ``pl_module.model.config``.
* Intervals default to the Trainer's ``log_every_n_steps`` (``log_every=`` overrides it).
* The loss is the mean of the step's ``training_step`` losses, kept by reference and averaged at
  the log boundary (``integrations/losses.py``: no kernel on an ordinary step); the learning
  rate is the first parameter group's, read before the optimizer steps.
* What a step costs: the batches and losses are only kept by reference; they are read
  (``batch_to_form``, ``observe_batch``) in one loop at the log boundary, or once 16 batches are
  kept (``batches.PendingSteps``; at once for a batch with images or ``inputs_embeds``; the first
  step at its end, so a batch that cannot be read fails at once). So the batches must not be
  modified in place before the interval ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback  # type: ignore[assignment]

from packscope.agent.agent import Agent
from packscope.agent.config import AgentConfig
from packscope.agent.hf_structure import spec_from_any_hf_config
from packscope.agent.integrations.batches import HEAVY_KEYS, PendingSteps, audio_kwargs, image_kwargs, observe_kwargs
from packscope.agent.integrations.losses import MeanLoss
from packscope.agent.integrations.trainer_logs import TrainerLogs
from packscope.core.flops import ModelSpec


def _default_form(batch: Any) -> dict[str, Any] | None:
    if not isinstance(batch, dict):
        raise TypeError(
            f"PackscopeCallback reads dict batches by their keys; for a {type(batch).__name__} batch "
            "pass batch_to_form=lambda batch: dict(cu_seqlens=..., shape=...) (observe_batch's arguments)"
        )
    form = observe_kwargs(batch)
    if form is None:
        raise KeyError(
            f"PackscopeCallback found no input_ids/tokens/inputs_embeds in the batch (keys: {sorted(batch)}); "
            "pass batch_to_form=... to say how to read it"
        )
    return form


def _find_spec(pl_module: Any, model: ModelSpec | Any | None, tp: int) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if model is not None:
        return spec_from_any_hf_config(model, tp=tp)
    for owner in (pl_module, getattr(pl_module, "model", None)):
        config = getattr(owner, "config", None)
        if config is not None and (isinstance(config, dict) or hasattr(config, "to_dict")):
            return spec_from_any_hf_config(config, tp=tp)
    raise ValueError("PackscopeCallback needs the FLOPs model: pass model=ModelSpec(...) or a Hugging Face config")


class PackscopeCallback(Callback):
    """Other keyword arguments go to :class:`AgentConfig` (``log_every`` defaults to the
    Trainer's ``log_every_n_steps``); ``tp`` pads the vocabulary as a tensor-parallel trainer
    would (docs/flops.md). ``log_to_trainer`` (default True) gives the Trainer's loggers useful
    TFLOP/s, MFU and the largest loss once per interval (integrations/trainer_logs.py); False
    leaves them alone."""

    def __init__(
        self,
        server: str | None = None,
        run_name: str = "run",
        *,
        model: ModelSpec | Any | None = None,
        batch_to_form: Callable[[Any], dict[str, Any] | None] | None = None,
        tp: int = 1,
        log_to_trainer: bool = True,
        **config: Any,
    ) -> None:
        self.agent_config = dict(server=server, run_name=run_name, **config)
        self.model = model
        self.batch_to_form = batch_to_form or _default_form
        self.tp = tp
        self.log_to_trainer = log_to_trainer
        self._trainer_logs: TrainerLogs | None = None
        self.agent: Agent | None = None
        self._in_step = False
        self._optimizer_stepped = False
        self._losses = MeanLoss()  # the micro-batches' losses, by reference until the boundary
        self._batches: list[Any] = []  # the open step's batches
        self._step_losses: list[tuple[torch.Tensor, float]] = []  # the open step's (loss, scale)
        # The ended steps' (batches, losses), until observed together.
        self._pending = PendingSteps[tuple[list[Any], list[tuple[torch.Tensor, float]]]](self._observe_step)
        self._lr: float | None = None

    def _running(self) -> Agent:
        if self.agent is None:
            raise RuntimeError("PackscopeCallback: the agent starts in on_train_start, which has not run")
        return self.agent

    def on_train_start(self, trainer, pl_module) -> None:
        settings = dict(self.agent_config)
        settings.setdefault("start_step", trainer.global_step)
        settings.setdefault("log_every", max(1, int(trainer.log_every_n_steps or 1)))
        self.agent = Agent(
            AgentConfig(**settings), model=_find_spec(pl_module, self.model, self.tp), device=pl_module.device
        )
        self.agent.announce()
        if self.agent.model.routing_dependent:  # zero-computation experts: the routed work is the routing's
            self.agent.count_routing(pl_module)
        self.agent.interval_loss = self._losses.interval_mean
        self.agent.before_boundary = self._pending.observe
        if self.log_to_trainer:
            self._trainer_logs = TrainerLogs(self.agent)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self._in_step:
            self._running().step_begin()
            self._in_step = True
        self._batches.append(batch)
        if not self._pending.heavy and isinstance(batch, dict) and not HEAVY_KEYS.isdisjoint(batch):
            self._pending.heavy = True  # not kept past its step

    def _observe_step(self, step: tuple[list[Any], list[tuple[torch.Tensor, float]]]) -> None:
        batches, losses = step
        agent = self._running()
        for batch in batches:
            form = self.batch_to_form(batch)
            if form is not None:
                # A dict batch's images and audio clips too, unless batch_to_form already says them.
                towers = {}
                if isinstance(batch, dict):
                    towers = {**image_kwargs(batch, agent.model.vision), **audio_kwargs(batch, agent.model.audio)}
                agent.observe_batch(**{**towers, **form})
        for loss, scale in losses:
            self._losses.add(loss, scale)
        if losses:  # a step closed without its optimizer step has none, and no step loss
            self._losses.end_step()

    def _end_step(self, losses: list[tuple[torch.Tensor, float]], lr: float | None = None) -> None:
        self._pending.end_step((self._batches, losses), len(self._batches))
        self._batches, self._step_losses = [], []
        self._running().step_end(lr=lr)  # a boundary observes the kept steps first (before_boundary)
        self._in_step = False

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._optimizer_stepped = True
        lr = optimizer.param_groups[0]["lr"]
        self._lr = float(lr) if isinstance(lr, (int, float)) else None  # a tensor lr would need a read

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            # Lightning hands back the loss divided by accumulate_grad_batches, as it backpropagates it.
            scale = trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1
            # Automatic optimization hands a detached copy already; a manual one, the loss itself.
            self._step_losses.append((loss.detach() if loss.requires_grad else loss, scale))
        if not self._optimizer_stepped:
            return
        self._optimizer_stepped = False
        self._end_step(self._step_losses, self._lr)
        self._log_to_trainer(trainer)

    def _log_to_trainer(self, trainer) -> None:
        # Straight to the loggers as host floats, once per new interval record: pl_module.log
        # would make each a device tensor (a host-to-device copy that waits for the GPU).
        if self._trainer_logs is None:
            return
        values = self._trainer_logs.take()
        if values:
            for logger in trainer.loggers:
                logger.log_metrics(values, step=trainer.global_step)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.agent is not None:
            self._close_open_step()
            self.agent.close()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.agent is not None:
            self._close_open_step()
            self.agent.close("failed")

    def _close_open_step(self) -> None:
        # Micro-batches after the last optimizer step (an epoch that ends mid-accumulation
        # still steps in Lightning; an interrupted run may not) still get counted.
        if self._in_step:  # a step without its optimizer step has no loss, as before
            self._end_step([])
