"""packscope.backend: the FastAPI server that stores interval records and serves the dashboards.

It must never import torch; the FLOPs formula comes from the pure-Python packscope.agent.flops.
"""
