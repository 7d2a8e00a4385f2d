"""packscope in torchtitan's trainer (tested with torchtitan 0.3.0: ``pip install 'packscope[torchtitan]'``)::

    from packscope.agent.integrations.torchtitan import PackscopeTrainer
    from torchtitan.models.llama3 import config_registry

    config = PackscopeTrainer.Config.from_trainer_config(
        config_registry.llama3_8b(), server="http://packscope:8000", run_name="llama3-8b"
    )
    trainer = config.build()        # torchtitan's Trainer, with the agent in it
    trainer.train()
    trainer.close()

(or declare ``PackscopeTrainer.Config(...)`` in a config registry of your own; from torchtitan's
command line the settings are ``--packscope.server URL`` and so on).

* The FLOPs model is read from the model config torchtitan builds its model from
  (`spec_from_torchtitan`: `dim`, `vocab_size`, the layers' attention heads, KV heads and head
  size, the feed-forward width; MoE layers' experts, top-k and shared experts).
* One agent step per `train_step` (an optimizer step, gradient accumulation included); every
  micro-batch is seen in `forward_backward_step`: with flex or varlen attention, which mask
  documents by their `positions`, as `position_ids`; otherwise as plain rows of `seq_len`
  tokens, which is what causal attention over a packed row computes.
* Loss: the step's token-weighted mean on this rank, from each micro-batch's loss (its summed
  loss over `global_valid_tokens`) and its labels, kept by reference and computed at the log
  boundary; the learning rate is the first scheduler's. Under pipeline parallelism the first
  stage counts the micro-batches and the loss is left out.
* Data, tensor and context parallelism: every rank sends its own records; only the ranks of the
  data-parallel ("batch") group that holds rank 0 count documents.
* The agent is created at the first step (after a checkpoint load, so that steps continue
  from the checkpoint's) and closed by `close()`, as "failed" when `train()` raised.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torchtitan.models.common.attention import FlexAttention, VarlenAttention
from torchtitan.trainer import Trainer

from packscope.agent.agent import Agent
from packscope.agent.config import AgentConfig
from packscope.agent.integrations.losses import TokenWeightedLoss
from packscope.core.flops import ModelSpec


def spec_from_torchtitan(model_config: Any, tp: int = 1, name: str | None = None) -> ModelSpec:
    """The FLOPs model of a torchtitan decoder config (llama3, qwen3 and their MoE variants:
    grouped-query attention); a clear error for what it cannot describe (e.g. MLA)."""
    layers = list(getattr(model_config, "layers", None) or [])
    if not layers or not hasattr(model_config, "dim"):
        raise ValueError(
            f"{type(model_config).__qualname__} is not a torchtitan decoder config; pass model=ModelSpec(...)"
        )
    first = layers[0]
    qkv = getattr(first.attention, "qkv_linear", None)
    if qkv is None:
        raise ValueError(
            f"the attention of {type(model_config).__qualname__} ({type(first.attention).__qualname__}) is not "
            "grouped-query attention with a qkv_linear, which packscope's FLOPs model describes (multi-head "
            "latent attention is not); pass model=ModelSpec(...)"
        )
    moe = [getattr(layer, "moe", None) for layer in layers]
    dense = next((layer.feed_forward for layer in layers if getattr(layer, "feed_forward", None) is not None), None)
    experts = next((m for m in moe if m is not None), None)
    moe_fields: dict[str, Any] = {}
    if experts is not None:
        shared = experts.shared_experts
        moe_fields = dict(
            moe_layers=tuple(int(m is not None) for m in moe),
            moe_ffn=experts.routed_experts.inner_experts.hidden_dim,
            moe_topk=experts.router.top_k,
            moe_shared_ffn=shared.w1.out_features if shared is not None else 0,
        )
    ffn = dense.w1.out_features if dense is not None else moe_fields["moe_ffn"]
    return ModelSpec(
        layers=len(layers),
        hidden=model_config.dim,
        heads=qkv.n_heads,
        kv_heads=qkv.n_kv_heads,
        head_dim=qkv.head_dim,
        ffn=ffn,
        vocab=model_config.vocab_size,
        gated=dense is None or getattr(dense, "w3", None) is not None,  # SwiGLU: w1, w2, w3
        tp=tp,
        name=name or type(model_config).__qualname__.split(".")[0].lower(),
        **moe_fields,
    )


@dataclass(kw_only=True, slots=True)
class PackscopeSettings:
    """`AgentConfig`'s fields, settable from torchtitan's command line (`--packscope.server URL`)."""

    server: str | None = None
    run_name: str = "torchtitan"
    project: str = "default"
    log_every: int = 10
    spool_dir: str | None = None  # with server None: the run is kept there for `packscope sync`
    token: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # any other AgentConfig field

    def agent_config(self, **defaults: Any) -> AgentConfig:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return AgentConfig(**{**defaults, **fields, **self.extra})


class PackscopeTrainer(Trainer):
    """torchtitan's Trainer with the packscope agent in it (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        packscope: PackscopeSettings = field(default_factory=PackscopeSettings)

        @classmethod
        def from_trainer_config(cls, config: Trainer.Config, **settings: Any) -> PackscopeTrainer.Config:
            """The same training, with the agent: `settings` are PackscopeSettings' fields."""
            values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
            return cls(**values, packscope=PackscopeSettings(**settings))

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        # Flex and varlen attention mask documents by their positions; other attention runs
        # causally over each whole row, which is then the sequence.
        inner = getattr(self.model_config.first_attention, "inner_attention", None)
        self._by_document = isinstance(inner, FlexAttention.Config | VarlenAttention.Config)
        self.packscope_agent: Agent | None = None
        self._packscope_losses = TokenWeightedLoss()
        self._packscope_status = "finished"

    # -- the steps ---------------------------------------------------------------------------
    def _agent(self) -> Agent:
        if self.packscope_agent is None:
            settings: PackscopeSettings = self.config.packscope
            agent_config = settings.agent_config(start_step=self.step - 1, config=_plain(self.config))
            dims = self.parallel_dims
            dp_group = dims.get_mesh("batch").get_group() if dims.dp_enabled else None
            spec = spec_from_torchtitan(self.model_config, name=self.config.model_spec.name)
            self.packscope_agent = Agent(agent_config, model=spec, device=self.device, dp_group=dp_group)
            self.packscope_agent.interval_loss = self._packscope_losses.interval_mean
        return self.packscope_agent

    def train_step(self, data_iterator):
        agent = self._agent()
        agent.step_begin()
        try:
            super().train_step(data_iterator)
        finally:  # a step cut short (the data ran out) still ends, so every begun step is reported
            self._packscope_losses.end_step()
            lrs = self.lr_schedulers.get_metrics()
            agent.step_end(lr=next(iter(lrs.values()), None))

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
        loss = super().forward_backward_step(
            input_dict=input_dict, labels=labels, global_valid_tokens=global_valid_tokens
        )
        agent = self._agent()
        if self.parallel_dims.pp_enabled:
            if self.pp_has_first_stage:
                for micro_batch in input_dict:
                    _observe(agent, micro_batch, self._by_document)
            return loss
        _observe(agent, input_dict, self._by_document)
        # The loss is this micro-batch's summed loss over global_valid_tokens (torchtitan's
        # labels are the targets already): weighed with its labels at the boundary.
        self._packscope_losses.add(loss.detach(), labels, shifted=True, divisor=global_valid_tokens)
        return loss

    # -- the end -----------------------------------------------------------------------------
    def train(self):
        try:
            super().train()
        except BaseException:
            self._packscope_status = "failed"
            raise

    def close(self) -> None:
        if self.packscope_agent is not None:
            self.packscope_agent.close(self._packscope_status)
        super().close()


def _observe(agent: Agent, input_dict: dict[str, torch.Tensor], by_document: bool) -> None:
    tokens = input_dict["input"]
    positions = input_dict.get("positions")
    if by_document and isinstance(positions, torch.Tensor) and positions.dim() <= 2:
        agent.observe_batch(position_ids=positions)  # documents restart their positions at 0
    else:  # causal attention over every row: one sequence a row
        agent.observe_batch(shape=(tokens.shape[0], tokens.shape[1]))


def _plain(config: Any) -> dict[str, Any]:
    """What the run page shows of the trainer's config: the training and parallelism sections and
    the model's name (not the model config itself: one entry per layer)."""
    spec = config.model_spec
    plain: dict[str, Any] = {"model": f"{spec.name} {spec.flavor}" if spec is not None else None}
    for section in ("training", "parallelism"):
        value = getattr(config, section, None)
        if dataclasses.is_dataclass(value):
            plain[section] = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return plain
