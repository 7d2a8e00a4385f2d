"""Small config dataclasses for the reference trainer: the model, the synthetic data, the run.

No torch here, so that the CLI can build its parser without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from packscope.core.flops import ModelSpec


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
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    lr: float = 3e-4  # a learning rate that suits this size
    name: str = ""

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head dim, got {self.head_dim}")

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
        layers=4, hidden=128, heads=4, kv_heads=2, ffn=384, vocab=512,
        tie_embeddings=True, lr=3e-3, name="tiny",
    ),
    # ~125M parameters (GPT-2 small sized, untied head).
    "small": ModelConfig(
        layers=12, hidden=768, heads=12, kv_heads=4, ffn=2048, vocab=32000,
        lr=6e-4, name="small",
    ),
    # ~0.9B parameters; fits one H200 with fp32 master weights and AdamW state.
    "1b": ModelConfig(
        layers=16, hidden=2048, heads=16, kv_heads=8, ffn=5632, vocab=32000,
        lr=3e-4, name="1b",
    ),
}
PRESETS["125m"] = replace(PRESETS["small"], name="125m")


@dataclass(frozen=True)
class DataConfig:
    """Synthetic documents: a chat-like short mode and a long mode, both log-normal."""

    min_len: int = 16
    short_share: float = 0.7
    short_median: int = 96
    long_median: int = 1024
    sigma: float = 0.8
    rules: int = 8  # affine recurrences that generate the content


@dataclass
class TrainConfig:
    preset: str = "tiny"
    layout: str = "thd"  # "thd": packed with per-document attention; "bshd": one document per padded row
    steps: int = 100
    pack_length: int = 512
    packs_per_step: int = 4  # token budget per step = packs_per_step * pack_length
    micro_batches: int = 1  # gradient accumulation; packs_per_step is split evenly between them
    max_docs_per_pack: int = 64
    align: int = 1  # THD: each document's slot is rounded up to a multiple of this
    static: bool = False  # THD: fixed cu_seqlens size and a dummy tail (CUDA graphs, no recompiles)
    lr: float | None = None  # None: the preset's
    warmup_steps: int = 10
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    dtype: str = "bfloat16"  # autocast dtype on CUDA; CPU always runs float32
    compile: bool = False
    log_every: int = 10
    progress: bool = True
    server: str | None = None  # None: the agent counts but sends nothing
    name: str | None = None  # None: made from the layout and preset
    project: str = "packscope"
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self) -> None:
        ModelConfig.preset(self.preset)
        if self.layout not in ("thd", "bshd"):
            raise ValueError(f"layout must be 'thd' or 'bshd', got {self.layout!r}")
        for key in ("steps", "pack_length", "packs_per_step", "micro_batches", "max_docs_per_pack",
                    "align", "log_every"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.packs_per_step % self.micro_batches:
            raise ValueError(
                f"packs_per_step ({self.packs_per_step}) must be a multiple of micro_batches "
                f"({self.micro_batches}): each micro-batch gets the same number of packs"
            )
        if self.pack_length % self.align:
            raise ValueError(f"pack_length ({self.pack_length}) must be a multiple of align ({self.align})")
        if self.data.min_len > self.pack_length:
            raise ValueError(f"pack_length ({self.pack_length}) is below the shortest document ({self.data.min_len})")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be 'bfloat16', 'float16' or 'float32', got {self.dtype!r}")

    @property
    def model(self) -> ModelConfig:
        return ModelConfig.preset(self.preset)

    @property
    def packs_per_micro_batch(self) -> int:
        return self.packs_per_step // self.micro_batches

    @property
    def run_name(self) -> str:
        return self.name or f"{self.preset}-{self.layout}-{self.pack_length}"

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else self.model.lr
