"""packscope.trainer: the reference trainer, a Llama-style decoder trained on synthetic documents
in THD (packed) or BSHD (padded) layout, with the packscope agent attached.

    packscope train --layout thd --preset tiny --steps 100

Attributes load lazily so that the CLI can read the configs without importing torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ModelConfig": "packscope.trainer.config",
    "DataConfig": "packscope.trainer.config",
    "TrainConfig": "packscope.trainer.config",
    "PRESETS": "packscope.trainer.config",
    "Transformer": "packscope.trainer.model",
    "Batch": "packscope.trainer.packing",
    "pack_thd": "packscope.trainer.packing",
    "pack_bshd": "packscope.trainer.packing",
    "Trainer": "packscope.trainer.train",
    "run_training": "packscope.trainer.train",
    "add_train_arguments": "packscope.trainer.train",
    "train_from_args": "packscope.trainer.train",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'packscope.trainer' has no attribute {name!r}")
