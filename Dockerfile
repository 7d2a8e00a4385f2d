# The packscope server (dashboards + ingest). The agent needs only `pip install packscope` in the trainer.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

# torch is a dependency of the distribution (the agent's), pinned first as in the Makefile (2.13.0 is
# the CPU wheel on the registries this project uses). The server itself never imports it.
RUN pip install torch==2.13.0

COPY pyproject.toml README.md ./
COPY packscope packscope
COPY agent agent
COPY trainer trainer
COPY backend backend
COPY frontend frontend
COPY alembic alembic
RUN pip install '.[server]'

EXPOSE 8000
# Migrations run on start (alembic upgrade head), so an empty database is ready at once.
CMD ["packscope", "serve", "--host", "0.0.0.0"]
