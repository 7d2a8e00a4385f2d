"""Small config dataclasses for the reference trainer: the model, the synthetic data, the run,
and the `packscope train` command line generated from the run's fields.

No torch here, so that the CLI can build its parser without importing torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeGuard

from packscope.core.attention import SLIDING
from packscope.core.flops import ModelSpec
from packscope.trainer.faults import FORMS, Fault, parse_fault


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder: RMSNorm, RoPE, GQA, SwiGLU."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tie_embeddings: bool = False
    fused_projections: bool = False  # q/k/v and gate/up each as one GEMM (same math, other parameter names)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    lr: float = 3e-4  # a learning rate that suits this size
    name: str = ""
    # Sliding-window attention in every layer (Mistral-7B-v0.1's pattern): a token attends to
    # itself and the window - 1 tokens before it in its document. None: full causal attention.
    window: int | None = None

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head dim, got {self.head_dim}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def to_model_spec(self) -> ModelSpec:
        """The FLOPs model of exactly this network, for the agent."""
        return ModelSpec(
            layers=self.layers,
            hidden=self.hidden,
            heads=self.heads,
            kv_heads=self.kv_heads,
            ffn=self.ffn,
            vocab=self.vocab,
            gated=True,
            layer_kinds=None if self.window is None else (SLIDING,) * self.layers,
            window=self.window,
            name=self.name,
        )

    @classmethod
    def preset(cls, name: str) -> ModelConfig:
        try:
            return PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}") from None


PRESETS: dict[str, ModelConfig] = {
    # ~0.85M parameters: CPU tests and demos.
    "tiny": ModelConfig(
        layers=4,
        hidden=128,
        heads=4,
        kv_heads=2,
        ffn=384,
        vocab=512,
        tie_embeddings=True,
        lr=3e-3,
        name="tiny",
    ),
    # ~125M parameters (GPT-2 small sized, untied head).
    "small": ModelConfig(
        layers=12,
        hidden=768,
        heads=12,
        kv_heads=4,
        ffn=2048,
        vocab=32000,
        lr=6e-4,
        name="small",
    ),
    # ~0.9B parameters; fits one H200 with fp32 master weights and AdamW state.
    "1b": ModelConfig(
        layers=16,
        hidden=2048,
        heads=16,
        kv_heads=8,
        ffn=5632,
        vocab=32000,
        lr=3e-4,
        name="1b",
    ),
}
PRESETS["125m"] = replace(PRESETS["small"], name="125m")


def option(default: Any, help: str, **metadata: Any) -> Any:
    """A field with a default and its `packscope train` help (``choices=`` narrows a plain str)."""
    return field(default=default, metadata={"help": help, **metadata})


@dataclass(frozen=True)
class DataConfig:
    """Synthetic documents: a chat-like short mode and a long mode, both log-normal."""

    min_len: int = option(16, "shortest document, in tokens")
    short_share: float = option(0.7, "share of documents drawn from the short, chat-like mode")
    short_median: int = option(96, "median length of the short mode, in tokens")
    long_median: int = option(1024, "median length of the long mode (documents are clipped to --pack-length)")
    sigma: float = option(0.8, "log-normal spread of both modes")
    rules: int = option(8, "affine recurrences that generate the content, one vocabulary band each")

    def __post_init__(self) -> None:
        for key in ("min_len", "short_median", "long_median", "rules"):
            if getattr(self, key) < 1:
                raise ValueError(f"data.{key} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.short_share <= 1:
            raise ValueError(f"data.short_share must be between 0 and 1, got {self.short_share}")
        if self.sigma < 0:
            raise ValueError(f"data.sigma must be >= 0, got {self.sigma}")


Layout = Literal["thd", "bshd"]
Device = Literal["auto", "cpu", "cuda"]
DType = Literal["bfloat16", "float16", "float32"]
ParallelKind = Literal["none", "ddp", "fsdp2"]
SyncBackend = Literal["debug-mode", "cupti"]


@dataclass
class TrainConfig:
    """One run of the reference trainer. Every field is also a `packscope train` option
    (``add_train_arguments``), so a new field needs no second edit to reach the command line."""

    preset: str = option("tiny", "model size", choices=sorted(PRESETS))
    layout: Layout = option("thd", "thd: packed, per-document attention; bshd: one document per padded row")
    steps: int = option(100, "the run's last step (a resumed run counts the steps before --start-step too)")
    pack_length: int = option(512, "token slots per pack; no document is longer")
    packs_per_step: int = option(4, "token budget per step, in packs of --pack-length")
    micro_batches: int = option(1, "gradient accumulation: --packs-per-step is split evenly between them")
    max_docs_per_pack: int = option(64, "THD: at most this many documents share a pack")
    align: int = option(1, "THD: round each document's slot up to a multiple of this")
    static: bool = option(False, "THD: static shapes, a fixed cu_seqlens size and a dummy tail (for CUDA graphs)")
    lr: float | None = option(None, "peak learning rate (default: the preset's)")
    warmup_steps: int = option(10, "steps of linear warmup; then cosine decay to a tenth of the peak")
    weight_decay: float = option(0.1, "AdamW weight decay of the weight matrices")
    grad_clip: float = option(1.0, "clip the gradient norm to this")
    seed: int = option(0, "seeds the model's initialization and the synthetic documents")
    device: Device = option("auto", "auto: CUDA when torch sees a GPU, else the CPU")
    dtype: DType = option("bfloat16", "autocast dtype on CUDA (the CPU runs float32)")
    compile: bool = option(False, "torch.compile the model")
    chunked_ce: bool = option(
        False,
        "cross-entropy over chunks of tokens: no float32 logits for every token "
        "(less memory, a little slower: docs/BENCHMARKS.md)",
    )
    fused_projections: bool = option(False, "q/k/v and gate/up projections each as one GEMM (same math, fewer kernels)")
    window: int | None = option(
        None,
        "sliding-window attention in every layer, as Mistral-7B-v0.1 (sliding_window: 4096): a token "
        "attends to the W latest tokens of its document (default: full causal attention)",
    )
    count_window_as_full: bool = option(
        False,
        "with --window: the agent counts every layer as full attention, as packscope did before it read "
        "windows (the over-count the fix removes; the training is the same)",
    )
    cuda_graphs: bool = option(
        False, "CUDA, THD with --static: capture forward+backward once and replay it (eager when a batch does not fit)"
    )
    legacy_logging: bool = option(
        False,
        "log the way loops used to (per-step .item(), torch.tensor accumulator, synchronize timer, "
        "NaN checks per bucket): the host syncs the fixed path avoids",
    )
    loader_delay_ms: float = option(
        0.0,
        "a slow data loader: the host sleeps this long before each step's batch (between steps, where a "
        "loader's wait falls; the ledger's data-wait pair)",
    )
    channel_loss: bool = option(False, "the loss per document source (code, math, chat, web), sent per interval")
    legacy_channel_loss: bool = option(
        False, "with --channel-loss: a per-document Python loop (three syncs per document), the slow baseline"
    )
    parallel: ParallelKind = option(
        "none",
        "none: one process; ddp or fsdp2: data parallel over the processes torchrun starts "
        "(torchrun --nproc-per-node N -m packscope train --parallel ddp ...), NCCL on CUDA, gloo on "
        "the CPU, each rank its own documents; every rank's agent sends its own records",
    )
    sync_backend: SyncBackend = option(
        "debug-mode", "how the agent counts host syncs (cupti: exact, needs cupti-python)"
    )
    count_syncs_every: int = option(
        8, "the agent counts host syncs over one interval in this many, after the first two (1: every interval)"
    )
    records_dir: str | None = option(
        None,
        "also write each rank's run (registration and interval records) to <dir>/rank<r>.jsonl, for packscope import",
    )
    log_every: int = option(10, "steps per agent interval")
    peak_tflops: float | None = option(
        None,
        "the device's dense peak in TFLOP/s, for MFU (default: looked up from the GPU's name; a CPU has "
        "none, so its MFU is not measured)",
    )
    progress: bool = option(True, "the progress bar")
    server: str | None = option(None, "packscope server URL (default: count, send nothing)")
    name: str | None = option(None, "run name (default: preset-layout-pack_length)")
    project: str = option("packscope", "project the run is filed under on the server")
    run_id: str | None = option(
        None,
        "continue the run with this id (a killed run's, as its progress bar and the dashboard show it): "
        "the server marks it running again, and the agent first sends what the killed run left in "
        "its spool (default: a new id from the name and the time)",
    )
    start_step: int = option(
        0,
        "with --run-id: the last step the killed run logged (its last step on the dashboard; best a "
        "multiple of --log-every). Steps, learning rate, data and interval indexes continue after it. "
        "Model weights are not restored (no checkpoints), so the loss starts over, but the documents, "
        "and so every interval's tokens and FLOPs, are those the killed run would have trained on",
    )
    faults: tuple[Fault, ...] = option(
        (),
        "inject a fault, to test alerts end to end (repeatable; steps count from 1): " + " · ".join(FORMS.values()),
        parse=parse_fault,
        flag="fault",
        metavar="KIND:KEY=VALUE,...",
    )
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self) -> None:
        # A fault may be given as its --fault text too.
        self.faults = tuple(parse_fault(f) if isinstance(f, str) else f for f in self.faults)
        ModelConfig.preset(self.preset)
        if self.loader_delay_ms < 0:
            raise ValueError(f"loader_delay_ms must be >= 0, got {self.loader_delay_ms}")
        for key, allowed in (
            ("layout", Layout),
            ("device", Device),
            ("dtype", DType),
            ("parallel", ParallelKind),
            ("sync_backend", SyncBackend),
        ):
            if getattr(self, key) not in typing.get_args(allowed):
                choices = ", ".join(map(repr, typing.get_args(allowed)))
                raise ValueError(f"{key} must be one of {choices}, got {getattr(self, key)!r}")
        for key in (
            "steps",
            "pack_length",
            "packs_per_step",
            "micro_batches",
            "max_docs_per_pack",
            "align",
            "log_every",
            "count_syncs_every",
        ):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("warmup_steps", "weight_decay", "start_step"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ValueError(f"peak_tflops must be > 0, got {self.peak_tflops}")
        if self.lr is not None and self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be > 0, got {self.grad_clip}")
        if self.start_step and self.run_id is None:
            raise ValueError(f"start_step ({self.start_step}) continues an existing run: give its run_id too")
        if self.start_step >= self.steps:
            raise ValueError(
                f"start_step ({self.start_step}) must be below steps ({self.steps}): steps is the "
                "run's last step, the steps before start_step included"
            )
        if self.packs_per_step % self.micro_batches:
            raise ValueError(
                f"packs_per_step ({self.packs_per_step}) must be a multiple of micro_batches "
                f"({self.micro_batches}): each micro-batch gets the same number of packs"
            )
        if self.pack_length % self.align:
            raise ValueError(f"pack_length ({self.pack_length}) must be a multiple of align ({self.align})")
        if self.data.min_len > self.pack_length:
            raise ValueError(f"pack_length ({self.pack_length}) is below the shortest document ({self.data.min_len})")
        if self.legacy_channel_loss and not self.channel_loss:
            raise ValueError("legacy_channel_loss is a way to compute --channel-loss: give channel_loss too")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.count_window_as_full and self.window is None:
            raise ValueError("count_window_as_full compares a --window run's counts: give window too")

    @property
    def model(self) -> ModelConfig:
        return replace(ModelConfig.preset(self.preset), fused_projections=self.fused_projections, window=self.window)

    @property
    def flops_model(self) -> ModelSpec:
        """What the agent counts: the model as trained, or with --count-window-as-full the count of
        packscope's reader before windows (every layer full attention)."""
        spec = self.model.to_model_spec()
        return replace(spec, layer_kinds=None, window=None) if self.count_window_as_full else spec

    @property
    def packs_per_micro_batch(self) -> int:
        return self.packs_per_step // self.micro_batches

    @property
    def run_name(self) -> str:
        return self.name or f"{self.preset}-{self.layout}-{self.pack_length}"

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else self.model.lr


# -- the command line, generated from the fields ---------------------------------------------------
def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """One option per TrainConfig field: the name in --kebab-case, typed by the annotation, with
    the field's help and default. A nested config's fields get its name as prefix (--data-sigma)."""
    _add_fields(parser, TrainConfig, prefix="")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig that parsed options describe; a ValueError says why it cannot be."""
    return _build(TrainConfig, vars(args), prefix="")


def _add_fields(parser: argparse.ArgumentParser, cls: type, prefix: str) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        dest, kind = prefix + f.name, hints[f.name]
        if _is_config(kind):
            _add_fields(parser, kind, prefix=f"{dest}_")
        else:
            _add_option(parser, dest, kind, f)


def _add_option(parser: argparse.ArgumentParser, dest: str, kind: Any, f: dataclasses.Field) -> None:
    flag = dest.replace("_", "-")
    help_text = f.metadata.get("help", "").replace("%", "%%")  # argparse formats help with %
    parse = f.metadata.get("parse")
    if parse is not None:
        # A repeatable option whose every text `parse` turns into one item of the field's tuple.
        parser.add_argument(
            f"--{f.metadata.get('flag', flag)}",
            dest=dest,
            action="append",
            type=_argument_type(parse),
            metavar=f.metadata.get("metavar"),
            help=help_text,
        )
        return
    if kind is bool:
        # A flag turns on what is off by default, --no-x turns off what is on.
        if f.default:
            parser.add_argument(f"--no-{flag}", dest=dest, action="store_false", help=f"turn off {help_text}")
        else:
            parser.add_argument(f"--{flag}", dest=dest, action="store_true", help=help_text)
        return
    value_type, choices = _value_type(kind, f"{dest}: {kind}")
    if f.default is not None:
        help_text += " (default: %(default)s)"
    choices = f.metadata.get("choices", choices)
    # A number shows its type (--steps INT); text reads best as its name (--server SERVER).
    metavar = value_type.__name__.upper() if value_type in (int, float) and not choices else None
    parser.add_argument(
        f"--{flag}", dest=dest, type=value_type, choices=choices, default=f.default, help=help_text, metavar=metavar
    )


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` for argparse, whose error line then says parse's ValueError, not only "invalid value"."""

    def parsed(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parsed


def _value_type(kind: Any, where: str) -> tuple[type, list | None]:
    """The argparse type, and choices, of an annotation: int, float, str, Literal[...], X | None."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is Literal:
        return type(args[0]), list(args)
    if len(args) == 2 and type(None) in args:  # X | None: None is the default, not a value to type
        return _value_type(next(a for a in args if a is not type(None)), where)
    if kind in (int, float, str):
        return kind, None
    raise TypeError(
        f"{where}: no command-line form for this type; give the field one of int, float, "
        "str, bool, Literal[...] or X | None, or teach _value_type the new one"
    )


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        dest, kind = prefix + f.name, hints[f.name]
        if _is_config(kind):
            kwargs[f.name] = _build(kind, values, f"{dest}_")
        elif "parse" in f.metadata:  # a repeatable option: None when not given
            kwargs[f.name] = tuple(values[dest] or ())
        else:
            kwargs[f.name] = values[dest]
    return cls(**kwargs)


def _is_config(kind: Any) -> TypeGuard[type]:
    """A nested config (a dataclass type), whose fields become options of their own."""
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)
