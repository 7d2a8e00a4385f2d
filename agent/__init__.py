"""packscope.agent: lives inside the trainer; imports torch and the standard library only.

Attributes load lazily so that the pure-Python FLOPs model (``packscope.agent.flops``) can be
imported by the backend without pulling in torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Agent": "packscope.agent.agent",
    "AgentConfig": "packscope.agent.config",
    "ModelSpec": "packscope.agent.flops",
    "FlopsBreakdown": "packscope.agent.flops",
    "read_hf_config": "packscope.agent.hf_config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'packscope.agent' has no attribute {name!r}")
