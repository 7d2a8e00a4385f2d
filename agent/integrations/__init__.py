"""Ready-made wiring of the agent into training libraries.

Each module imports its own library (``hf``: transformers; ``lightning``: lightning or
pytorch_lightning) when it is imported itself, so ``packscope.agent`` never needs them.
``batches`` turns a dict batch into ``observe_batch`` arguments and needs nothing but torch.
"""
