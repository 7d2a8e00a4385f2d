"""packscope.trainer: the reference trainer, a Llama-style decoder trained on synthetic documents
in THD (packed) or BSHD (padded) layout, with the packscope agent attached the way a user would
attach it (see ``train.py``).

    packscope train --layout thd --preset tiny --steps 100
"""
