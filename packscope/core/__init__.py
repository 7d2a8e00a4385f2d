"""packscope.core: the facts the agent and the server share, in pure Python.

It imports neither torch nor the server's libraries (tests/test_layering.py proves it), so the
trainer side and the dashboard side compute every number from one definition: the FLOPs model
(`flops`), the histogram edges (`histograms`) and the catalogue of interval fields and derived
metrics (`catalogue`).
"""
