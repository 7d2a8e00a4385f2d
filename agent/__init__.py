"""packscope.agent: lives inside the trainer; imports torch, the standard library and packscope.core."""

try:
    import torch
except ImportError as exc:
    raise ImportError(
        "packscope.agent runs inside a PyTorch trainer and needs torch >= 2.6, which is not installed here. "
        "Install your trainer's torch, or: pip install 'packscope[agent]'. "
        "(The dashboard needs no torch: pip install 'packscope[server]'.)"
    ) from exc
# Features, not version strings, so nightly and vendor builds pass.
if not (hasattr(torch, "accelerator") and hasattr(torch, "Event")):
    raise ImportError(
        f"packscope.agent needs torch >= 2.6 (torch.accelerator, torch.Event); this environment has torch "
        f"{torch.__version__}: pip install -U 'torch>=2.6'"
    )

from packscope.agent.agent import Agent
from packscope.agent.config import AgentConfig
from packscope.agent.hf_structure import read_any_hf_config, spec_from_any_hf_config
from packscope.core.flops import FlopsBreakdown, ModelSpec
from packscope.core.hf_config import read_hf_config

__all__ = [
    "Agent",
    "AgentConfig",
    "FlopsBreakdown",
    "ModelSpec",
    "read_any_hf_config",
    "read_hf_config",
    "spec_from_any_hf_config",
]
