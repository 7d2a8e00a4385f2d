"""PackscopeTrainer, torchtitan 0.3.0's Trainer with the agent: the FLOPs model read from
torchtitan's model configs, and a real Trainer run (llama3's debug model) on the CPU whose
records equal a brute-force count over the batches its dataloader made, with the loss torchtitan
itself logs.

torchtitan 0.3.0 pins datasets<4.8 and huggingface-hub<2, which packscope[hf] cannot share, so
these tests run in an environment of its own (`pip install 'packscope[torchtitan]' pytest`) and
are skipped elsewhere. torchtitan cannot train its language models on a CPU: it refuses SDPA for
them, FlexAttention has no backward on a CPU (torch 2.13) and varlen attention runs flash kernels
only. So the CPU run below computes the flex layers' document masks with SDPA (the same mask,
dense), points torchtitan's device type (it falls back to "cuda") and memory monitor at the CPU,
and skips the timeout change it makes behind a barrier on the current CUDA device; everything
else, the integration included, is torchtitan's own code.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import ClassVar

import pytest
import torch
import torch.distributed as dist

from packscope.core.ports import free_port

torchtitan = pytest.importorskip(
    "torchtitan", reason="torchtitan is not installed here: it needs an environment of its own (module docstring)"
)

from torchtitan.components.dataloader import BaseDataLoader  # noqa: E402
from torchtitan.models.deepseek_v3 import model_registry as deepseek  # noqa: E402
from torchtitan.models.llama3 import config_registry, model_registry  # noqa: E402
from torchtitan.models.qwen3 import model_registry as qwen3  # noqa: E402

from packscope.agent.histograms import NUM_BUCKETS, bucket_of  # noqa: E402
from packscope.agent.integrations.torchtitan import PackscopeTrainer, spec_from_torchtitan  # noqa: E402

VOCAB, SEQ_LEN, BATCH, STEPS, LOG_EVERY = 2048, 64, 2, 5, 2


def test_the_flops_model_is_read_from_the_model_config():
    spec = spec_from_torchtitan(model_registry("8B").model)
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim) == (32, 4096, 32, 8, 128)
    assert (spec.ffn, spec.vocab, spec.gated, spec.moe_layers) == (14336, 128256, True, None)
    moe = spec_from_torchtitan(qwen3("debugmodel_moe").model)
    assert moe.moe_layers == (1,) * moe.layers and moe.moe_topk == 8 and moe.moe_ffn == 768


def test_attention_it_cannot_describe_is_a_clear_error():
    with pytest.raises(ValueError, match="multi-head latent attention is not"):
        spec_from_torchtitan(deepseek("debugmodel").model)


class Documents(BaseDataLoader):
    """Rows of random tokens, documents packed back to back with restarting positions; keeps what
    it made (the truth) in `made`."""

    made: ClassVar[list[list[list[int]]]] = []  # per micro-batch, per row, the document lengths

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        pass

    def __init__(self, config, **kwargs):
        self.generator = torch.Generator().manual_seed(0)

    def __iter__(self):
        while True:
            rows = []
            positions = torch.zeros(BATCH, SEQ_LEN, dtype=torch.long)
            for row in positions:
                docs, start = [], 0
                while start < SEQ_LEN:
                    length = min(int(torch.randint(3, 30, (1,), generator=self.generator)), SEQ_LEN - start)
                    row[start : start + length] = torch.arange(length)
                    docs.append(length)
                    start += length
                rows.append(docs)
            Documents.made.append(rows)
            tokens = torch.randint(0, VOCAB, (BATCH, SEQ_LEN + 1), generator=self.generator)
            yield {"input": tokens[:, :-1], "positions": positions}, tokens[:, 1:]

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        pass


@pytest.fixture
def on_the_cpu(monkeypatch, tmp_path):
    """torchtitan on the CPU (module docstring): device type, memory monitor, attention kernel."""
    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.utils as dist_utils
    from torch.nn.attention.flex_attention import create_mask
    from torchtitan.models.common.attention import FlexAttention

    for name, module in list(sys.modules.items()):
        if name.startswith("torchtitan") and getattr(module, "device_type", None) == "cuda":
            monkeypatch.setattr(module, "device_type", "cpu")
            if hasattr(module, "device_module"):
                monkeypatch.setattr(module, "device_module", torch.cpu)

    class Zeros:
        def __getattr__(self, name):
            return 0.0

    class NoDeviceMemory:
        device_name = "cpu"

        def get_peak_stats(self):
            return Zeros()

        def reset_peak_stats(self):
            pass

    monkeypatch.setattr(metrics, "build_device_memory_monitor", NoDeviceMemory)
    # After the first step torchtitan shortens its process groups' timeouts behind a barrier on
    # the current CUDA device; a one-process run has no timeout to shorten.
    monkeypatch.setattr(dist_utils, "set_pg_timeouts", lambda **kwargs: None)

    def dense_document_attention(
        self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks, scale=None, enable_gqa=False, **kwargs
    ):  # FlexAttention.forward's signature: torchtitan maps shardings by these names
        b, length = q_BLNH.shape[0], q_BLNH.shape[1]
        mask = create_mask(attention_masks.mask_mod, b, 1, length, length, device=q_BLNH.device)
        q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa
        )
        return out.transpose(1, 2)

    monkeypatch.setattr(FlexAttention, "forward", dense_document_attention)
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo")
    yield
    dist.destroy_process_group()


def tokenizer_folder(path: Path) -> str:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    words = {"<unk>": 0, **{f"w{i}": i for i in range(1, VOCAB)}}
    Tokenizer(WordLevel(words, unk_token="<unk>")).save(str(path / "tokenizer.json"))
    return str(path)


def brute(micro_batches: list[list[list[int]]]) -> dict:
    docs = [d for rows in micro_batches for row in rows for d in row]
    hist = [0] * NUM_BUCKETS
    for d in docs:
        hist[bucket_of(d)] += 1
    return {
        "tokens": len(micro_batches) * BATCH * SEQ_LEN,
        "packs": len(micro_batches) * BATCH,
        "real_tokens": sum(docs),
        "documents": len(docs),
        "seqlen_sq_sum_bshd": len(micro_batches) * BATCH * SEQ_LEN**2,
        "seqlen_sq_sum_thd": sum(d * d for d in docs),
        "doc_hist": hist,
    }


def test_a_real_trainer_run_is_counted_exactly(on_the_cpu, tmp_path):
    torch.manual_seed(0)
    Documents.made = []
    config = config_registry.llama3_debugmodel()
    config.hf_assets_path = tokenizer_folder(tmp_path)
    config.dataloader = Documents.Config()
    config.training.steps, config.training.seq_len, config.training.local_batch_size = STEPS, SEQ_LEN, BATCH
    config.training.global_batch_size = 2 * BATCH  # two micro-batches a step
    config.training.disable_cuda_graphs = True
    config.validator.enable = False
    config.checkpoint.enable = False
    config.dump_folder = str(tmp_path / "run")
    config = PackscopeTrainer.Config.from_trainer_config(
        config, server=None, spool_dir=str(tmp_path / "spool"), run_name="titan", log_every=LOG_EVERY,
        extra={"count_syncs": False},
    )  # fmt: skip
    trainer = config.build()
    logged: list[float] = []
    original_log = trainer.metrics_processor.log
    trainer.metrics_processor.log = lambda step, loss, *a, **k: (logged.append(loss), original_log(step, loss, *a, **k))
    trainer.train()
    trainer.close()

    agent = trainer.packscope_agent
    assert agent.model == spec_from_torchtitan(trainer.model_config, name="llama3")
    records = list(agent.records)
    assert [(r["first_step"], r["last_step"]) for r in records] == [(1, 2), (3, 4), (5, 5)]
    trained = Documents.made[: 2 * STEPS]  # the loader may have made one batch ahead
    for i, r in enumerate(records):
        micro = trained[i * 2 * LOG_EVERY : min((i + 1) * 2 * LOG_EVERY, 2 * STEPS)]
        keys = ("tokens", "packs", "real_tokens", "documents", "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd")
        assert {**{k: r[k] for k in keys}, "doc_hist": r["histograms"]["documents"]["count"]} == brute(micro)
        steps = logged[i * LOG_EVERY : (i + 1) * LOG_EVERY]
        assert r["loss"] == pytest.approx(sum(steps) / len(steps), rel=1e-5)  # torchtitan's own loss
        assert r["lr"] is not None
    assert os.listdir(tmp_path / "spool")  # offline: the run is kept for `packscope sync`
