"""packscope.agent: lives inside the trainer; imports torch, the standard library and packscope.core."""

from packscope.agent.agent import Agent
from packscope.agent.config import AgentConfig
from packscope.core.hf_config import read_hf_config
from packscope.core.flops import FlopsBreakdown, ModelSpec

__all__ = ["Agent", "AgentConfig", "FlopsBreakdown", "ModelSpec", "read_hf_config"]
