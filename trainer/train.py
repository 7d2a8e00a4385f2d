"""The training loop, with the packscope agent wired in the way a user would wire it.

AdamW (fused on CUDA), bf16 autocast on CUDA, optional torch.compile, gradient accumulation over
micro-batches. Nothing here reads a device value on an ordinary step: the loss goes to the agent
as a device tensor, and the progress bar shows a copy taken at log steps once it has landed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import torch
from tqdm import tqdm

from packscope.agent import Agent, AgentConfig
from packscope.agent.lifecycle import EXCEPTION_CLOSE_S
from packscope.core.run_file import write_run_file
from packscope.core.urls import checked_server_url
from packscope.trainer import distributed
from packscope.trainer.attention import attention_for
from packscope.trainer.channel_loss import (
    ChannelBatch,
    channel_loss_sums,
    channel_loss_sums_loop,
    span_bounds,
    with_channels,
)
from packscope.trainer.config import TrainConfig, config_from_args
from packscope.trainer.data import CHANNELS, Document, DocumentStream, step_documents
from packscope.trainer.faults import DocumentSwitch, FaultInjector, active, injector_for, mix_data, mix_fault
from packscope.trainer.graphs import GraphedStep
from packscope.trainer.legacy_logging import LegacyLogging
from packscope.trainer.model import Transformer
from packscope.trainer.packing import Batch, pack_bshd, pack_thd


def resolve_device(cfg: TrainConfig) -> torch.device:
    """The device to train on; a ValueError says why the config cannot run here."""
    if cfg.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch sees no CUDA GPU; use --device cpu")
    else:
        device = torch.device(cfg.device)
    if device.type == "cuda" and cfg.layout == "thd" and cfg.dtype == "float32":
        raise ValueError("THD on CUDA runs FlashAttention varlen, which needs --dtype bfloat16 or float16")
    if cfg.cuda_graphs and device.type != "cuda":
        raise ValueError("--cuda-graphs captures CUDA work: it needs a CUDA GPU (--device cuda)")
    if cfg.cuda_graphs and (cfg.layout != "thd" or not cfg.static or cfg.parallel != "none"):
        raise ValueError(
            "--cuda-graphs captures the static THD form of one process: give --layout thd and "
            "--static, without --parallel"
        )
    return device


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak at the last step."""
    peak = cfg.learning_rate
    if step < cfg.warmup_steps:
        return peak * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - 1 - cfg.warmup_steps)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


class Trainer:
    """Model, optimizer and data of one run; ``run_training`` drives it step by step."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.model_cfg = cfg.model
        # Under torchrun: this rank's GPU, and the process group joined.
        self.parallel, self.device = distributed.setup(cfg.parallel, resolve_device(cfg))
        cuda = self.device.type == "cuda"
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.model = Transformer(self.model_cfg, max_positions=cfg.pack_length).to(self.device)
        wrapped = distributed.wrap(self.model, self.parallel, self.device)
        self.forward = torch.compile(wrapped) if cfg.compile else wrapped
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
            ],
            lr=cfg.learning_rate,
            betas=(0.9, 0.95),
            fused=cuda,
        )
        # Mixed precision on CUDA only: parameters and optimizer state stay float32.
        self.amp_dtype = getattr(torch, cfg.dtype) if cuda and cfg.dtype != "float32" else None
        seed = self.parallel.data_seed(cfg.seed)
        docs: Iterator[Document] = iter(DocumentStream(cfg.data, self.model_cfg.vocab, cfg.pack_length, seed))
        switch = None
        mix = mix_fault(cfg.faults)
        if mix is not None:  # --fault mix: a second stream, of another length mix, to switch to
            second = DocumentStream(mix_data(mix, cfg.data), self.model_cfg.vocab, cfg.pack_length, seed + 1)
            docs = switch = DocumentSwitch(docs, iter(second))
        # None without --fault: the loop tests it, nothing more.
        self.faults: FaultInjector | None = injector_for(
            cfg.faults, self.parallel.rank, self.parallel.world_size, switch
        )
        self._steps = step_documents(
            docs,
            cfg.micro_batches,
            cfg.packs_per_micro_batch,
            cfg.pack_length,
            cfg.max_docs_per_pack,
            cfg.align,
        )
        # A resumed run trains on the documents the killed run would have had next: the stream is
        # seeded, so drawing the earlier steps' documents again lands on them.
        for done in range(cfg.start_step):
            if switch is not None and mix is not None:
                switch.second = active(mix, done + 1)
            next(self._steps)
        self.step = cfg.start_step
        self.legacy_logging = LegacyLogging(self.device) if cfg.legacy_logging else None
        self.graphs = GraphedStep(self) if cfg.cuda_graphs else None

    def next_batches(self) -> list[Batch]:
        """The next step's micro-batches in the configured layout, on the device."""
        cfg = self.cfg
        if cfg.loader_delay_ms:  # a slow loader, as a trainer waiting for its next batch sees it
            time.sleep(cfg.loader_delay_ms / 1e3)
        groups = next(self._steps)
        tokens = [[doc.tokens for doc in g] for g in groups]
        if cfg.layout == "thd":
            batches = [
                pack_thd(t, cfg.pack_length, cfg.packs_per_micro_batch, cfg.max_docs_per_pack, cfg.align, cfg.static)
                for t in tokens
            ]
        else:
            batches = [pack_bshd(t, cfg.pack_length) for t in tokens]
        if cfg.channel_loss:
            pairs = zip(batches, groups, strict=True)
            batches = [with_channels(b, g, cfg.max_docs_per_pack, cfg.align) for b, g in pairs]
        return [b.to(self.device) for b in batches]

    def loss_terms(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch's summed loss over labelled tokens (float32, differentiable) and its
        per-token losses (detached, 0 where there is no label)."""
        # No autocast weight cache under CUDA graphs: it would outlive the capture.
        with torch.autocast(
            self.device.type,
            dtype=self.amp_dtype,
            enabled=self.amp_dtype is not None,
            cache_enabled=self.graphs is None,
        ):
            attention = attention_for(batch, self.device, self.model_cfg.window)
            return self.forward(batch.input_ids, batch.position_ids, attention, batch.labels, self.cfg.chunked_ce)

    def eager_forward_backward(self, batch: Batch, label_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        loss_sum, token_losses = self.loss_terms(batch)
        (loss_sum / label_tokens).backward()
        return loss_sum, token_losses

    def forward_backward(
        self, batch: Batch, label_tokens: int, channel_sums: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Add one micro-batch's gradients; return its share of the step's mean loss (detached).
        With ``channel_sums`` (--channel-loss), add its (loss, tokens) per channel into them.

        Dividing by the step's label count (a host int) makes the summed shares the mean over
        every predicted token of the step, the same number in both layouts.
        """
        run = self.graphs.run if self.graphs is not None else self.eager_forward_backward
        loss_sum, token_losses = run(batch, label_tokens)
        if channel_sums is not None:
            reduce = channel_loss_sums_loop if self.cfg.legacy_channel_loss else channel_loss_sums
            spans = cast(ChannelBatch, batch).span_channels  # next_batches adds them under --channel-loss
            assert spans is not None and token_losses is not None
            channel_sums += reduce(token_losses, batch.labels, span_bounds(batch), spans, len(CHANNELS))
        return loss_sum.detach() / label_tokens

    def optimizer_step(self) -> tuple[float, torch.Tensor]:
        """Clip, step and clear; return the learning rate used and the gradient norm (on device)."""
        lr = lr_at(self.step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        # A CUDA graph owns the gradient tensors: zero them in place, never drop them.
        self.optimizer.zero_grad(set_to_none=self.graphs is None)
        self.step += 1
        return lr, distributed.local(grad_norm)


def observe(agent: Agent, batch: Batch) -> None:
    """Tell the agent about one micro-batch, in the form this layout has."""
    if batch.layout == "thd":
        agent.observe_batch(
            cu_seqlens=batch.cu_seqlens,
            cu_seqlens_padded=batch.cu_seqlens_padded,
            shape=(batch.n_packs, batch.pack_length),
            # Static shapes add a dummy tail of padding; the mask tells the agent it is not a document.
            token_mask=batch.token_mask if batch.static else None,
        )
    else:
        agent.observe_batch(attention_mask=batch.attention_mask)


def train_step(trainer: Trainer, batches: list[Batch], agent: Agent | None = None) -> torch.Tensor:
    """One optimizer step over ``batches`` (micro-batches), with the agent's calls where a user
    would put them; returns the step's mean loss as a device tensor (never read here)."""
    label_tokens = sum(b.label_tokens for b in batches)
    legacy = trainer.legacy_logging
    faults = trainer.faults
    if agent is not None:
        agent.step_begin()
    if faults is not None:
        faults.step_began()
    if legacy is not None:
        legacy.step_begin()
    loss = legacy.loss_accumulator() if legacy is not None else torch.zeros((), device=trainer.device)
    channel_sums = None
    if trainer.cfg.channel_loss:
        channel_sums = torch.zeros(len(CHANNELS), 2, dtype=torch.float64, device=trainer.device)
    for batch in batches:
        if agent is not None:
            observe(agent, batch)
        loss += trainer.forward_backward(batch, label_tokens, channel_sums)
    if legacy is not None:
        legacy.check_gradients(trainer.model)
    lr, grad_norm = trainer.optimizer_step()
    if faults is not None:  # trainer.step: the number of the step just taken, from 1
        faults.inside_step(trainer.step, loss)
    if legacy is not None:
        legacy.step_end(loss, grad_norm)
    if agent is not None:
        names = None if channel_sums is None else CHANNELS
        agent.step_end(loss=loss, lr=lr, grad_norm=grad_norm, channel_loss=channel_sums, channel_names=names)
    return loss


class LossReadout:
    """The loss for the progress bar without waiting for the device.

    At a log step the loss is copied into pinned memory behind an event; ``poll`` hands it over
    once the event has completed. On the CPU there is nothing to wait for.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host = torch.zeros((), pin_memory=self.cuda)
        self.event: torch.cuda.Event | None = None
        self.value: float | None = None

    def push(self, loss: torch.Tensor) -> None:
        # Any one-element loss, as the agent takes: --legacy-logging's accumulator is a [1] tensor.
        self.host.copy_(loss.detach().reshape(()), non_blocking=True)
        if self.cuda:
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.value = float(self.host)

    def poll(self) -> float | None:
        if self.event is not None and self.event.query():
            self.event = None
            self.value = float(self.host)
        value, self.value = self.value, None
        return value


def run_training(cfg: TrainConfig) -> dict:
    """Train steps ``cfg.start_step + 1`` to ``cfg.steps`` with the agent attached; return a summary."""
    trainer = Trainer(cfg)
    agent = Agent(
        AgentConfig(
            server=cfg.server,
            run_name=cfg.run_name,
            project=cfg.project,
            layout=cfg.layout,
            log_every=cfg.log_every,
            run_id=cfg.run_id,
            start_step=cfg.start_step,
            tags=["reference-trainer", cfg.preset, cfg.layout],
            config=dataclasses.asdict(cfg),
            sync_backend=cfg.sync_backend,
            count_syncs_every=cfg.count_syncs_every,
            peak_tflops=cfg.peak_tflops,
            # Its THD packer makes packs of --pack-length: the baseline says so on the run page.
            pack_length=cfg.pack_length if cfg.layout == "thd" else None,
            pack_length_from="--pack-length" if cfg.layout == "thd" else None,
        ),
        model=cfg.flops_model,
        # The trainer's device, not the agent's guess: on a GPU machine, a --device cpu run's steps
        # are timed by the host clock, not by events of an idle GPU.
        device=trainer.device,
    )
    agent.announce()
    readout = LossReadout(trainer.device)
    # The bar shows the run id: what --run-id needs to continue this run if it is killed.
    bar = tqdm(
        range(cfg.start_step, cfg.steps),
        desc=agent.run_id,
        initial=cfg.start_step,
        total=cfg.steps,
        unit="step",
        disable=not cfg.progress or trainer.parallel.rank != 0,
    )
    first_loss = loss = None
    real_tokens = slots = logged_tokens = 0
    start = logged_at = time.perf_counter()
    rate = 0.0
    try:
        for step in bar:
            if trainer.faults is not None:
                trainer.faults.before_step(step + 1)
            batches = trainer.next_batches()
            loss = train_step(trainer, batches, agent)

            first_loss = loss if first_loss is None else first_loss
            real_tokens += sum(b.real_tokens for b in batches)
            slots += sum(b.tokens for b in batches)
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                readout.push(loss)
                now = time.perf_counter()
                rate = (real_tokens - logged_tokens) / (now - logged_at)
                logged_tokens, logged_at = real_tokens, now
            shown = readout.poll()
            if shown is not None:
                bar.set_postfix(loss=f"{shown:.4f}", tok_s=f"{rate:,.0f}", refresh=False)
    except BaseException:
        # As the agent's own exception hook: a Ctrl-C or a crash does not wait 30 s for the
        # server; what is not delivered stays in the spool for a resume or `packscope sync`.
        agent.close(status="failed", timeout_s=EXCEPTION_CLOSE_S)
        raise
    assert loss is not None and first_loss is not None  # start_step < steps: at least one step ran
    final_loss = float(loss)  # the one read that waits, after the last step
    elapsed = time.perf_counter() - start
    agent.close(status="finished")
    if cfg.records_dir:
        write_records(cfg.records_dir, agent)
    trainer.parallel.close()
    steps = cfg.steps - cfg.start_step  # trained by this process
    return {
        "run_id": agent.run_id,
        "rank": trainer.parallel.rank,
        "world_size": trainer.parallel.world_size,
        "name": cfg.run_name,
        "layout": cfg.layout,
        "preset": cfg.preset,
        "parameters": trainer.model.num_params(),
        "start_step": cfg.start_step,
        "steps": steps,
        "first_loss": float(first_loss),
        "final_loss": final_loss,
        "real_tokens": real_tokens,
        "token_slots": slots,
        "seconds": elapsed,
        "steps_per_s": steps / elapsed,
        "tokens_per_s": real_tokens / elapsed,
    }


def write_records(directory: str, agent: Agent) -> None:
    """This rank's run as a file (packscope/core/run_file.py) in <directory>/rank<r>.jsonl: the
    registration body, then the interval records the agent keeps (the last 1000), for a run
    without a server; `packscope import` sends it to one later."""
    run = agent.run_body()
    if agent.records:  # when the run started, not when it was written down
        run["started_at"] = datetime.fromtimestamp(agent.records[0]["wall_start"], UTC).isoformat()
    sent = [r for r in agent.records if "refused" not in r]  # refused: its counts are wrong
    write_run_file(Path(directory) / f"rank{agent.rank}.jsonl", run, sent)


def train_from_args(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
        resolve_device(cfg)
        if cfg.server is not None:  # refused now, not retried for ever as unreachable
            checked_server_url(cfg.server)
    except ValueError as err:
        print(f"packscope train: error: {err}", file=sys.stderr)
        return 2
    summary = run_training(cfg)
    # One write of the whole object: under torchrun every rank shares this stdout.
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    sys.stdout.flush()
    return 0
