"""torchtitan's trainer with packscope: `PackscopeTrainer`, torchtitan's Trainer with the agent.

    # torchtitan 0.3.0 pins datasets<4.8 and huggingface-hub<2, which packscope[hf] cannot share:
    # give it an environment of its own.
    pip install 'packscope[torchtitan]'
    torchrun --nproc-per-node 1 examples/torchtitan_trainer.py --server http://127.0.0.1:8000

llama3's debug model (6 layers, 256 wide, flex attention masking documents by their positions)
trains on synthetic packed rows; the FLOPs model is read from the model config torchtitan builds
it from. In your own run, take your config and
`PackscopeTrainer.Config.from_trainer_config(config, server=...)`, or make your config registry's
configs `PackscopeTrainer.Config`s and pass `--packscope.server URL`.

It needs a GPU: torchtitan 0.3.0 trains its language models on an accelerator only (it refuses
SDPA for them, FlexAttention has no backward on a CPU and varlen attention runs flash kernels),
so tests/agent/test_integrations_torchtitan.py runs the same Trainer on the CPU with the flex
layers' masks computed by SDPA.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

VOCAB = 2048  # the debug model's


def tokenizer_folder() -> str:
    """A word-level tokenizer.json where torchtitan looks for one (a real run has its model's)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    folder = tempfile.mkdtemp(prefix="torchtitan-tokenizer-")
    words = {"<unk>": 0, **{f"w{i}": i for i in range(1, VOCAB)}}
    Tokenizer(WordLevel(words, unk_token="<unk>")).save(str(Path(folder, "tokenizer.json")))
    return folder


def synthetic_dataloader():
    """A torchtitan dataloader of rows of random tokens, documents packed back to back with their
    positions (what a block-causal dataloader yields: flex attention masks each document)."""
    from torchtitan.components.dataloader import BaseDataLoader

    class SyntheticDocuments(BaseDataLoader):
        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):
            seed: int = 0

        def __init__(self, config, *, dp_rank, local_batch_size, seq_len, **_):
            self.generator = torch.Generator().manual_seed(config.seed + dp_rank)
            self.batch, self.seq_len = local_batch_size, seq_len

        def __iter__(self):
            while True:
                tokens = torch.randint(0, VOCAB, (self.batch, self.seq_len + 1), generator=self.generator)
                positions = torch.zeros(self.batch, self.seq_len, dtype=torch.long)
                for row in positions:
                    start = 0
                    while start < self.seq_len:
                        length = min(int(torch.randint(8, 64, (1,), generator=self.generator)), self.seq_len - start)
                        row[start : start + length] = torch.arange(length)
                        start += length
                yield {"input": tokens[:, :-1], "positions": positions}, tokens[:, 1:]

        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict) -> None:
            pass

    return SyntheticDocuments.Config()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "torchtitan_trainer.py: needs a CUDA GPU, and this machine has none: torchtitan trains its language "
            "models on a GPU only (this file's docstring says why). On the CPU, "
            "tests/agent/test_integrations_torchtitan.py runs the same Trainer with SDPA in place of flex attention."
        )
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)  # a plain `python` run is a world of one
    os.environ.setdefault("MASTER_PORT", "29511")

    try:
        from torchtitan.models.llama3 import config_registry
    except ImportError as err:
        raise SystemExit(
            f"torchtitan_trainer.py: {err}; pip install 'packscope[torchtitan]' (in an environment of its own)"
        ) from None

    from packscope.agent.integrations.torchtitan import PackscopeTrainer

    config = config_registry.llama3_debugmodel()
    config.hf_assets_path = tokenizer_folder()
    config.dataloader = synthetic_dataloader()
    config.training.steps, config.training.seq_len, config.training.local_batch_size = args.steps, 256, 2
    config.training.global_batch_size = 4  # two micro-batches a step
    config.training.disable_cuda_graphs = True
    config.validator.enable = False
    config.checkpoint.enable = False
    config.dump_folder = tempfile.mkdtemp(prefix="torchtitan-run-")
    config = PackscopeTrainer.Config.from_trainer_config(
        config, server=args.server, run_name="torchtitan-llama3-debug", log_every=5
    )
    trainer = config.build()
    try:
        trainer.train()
    finally:
        trainer.close()
    print(f"dashboard: {args.server}/runs/{trainer.packscope_agent.run_id}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
