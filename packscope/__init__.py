"""packscope: how fast is this training run, really?

The distribution maps its folders to import names: agent/ -> packscope.agent (in the trainer),
trainer/ -> packscope.trainer, backend/ -> packscope.backend, frontend/ -> packscope.frontend,
alembic/ -> packscope.migrations.
"""

__version__ = "0.1.0"
