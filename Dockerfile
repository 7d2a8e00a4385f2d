# The packscope server (dashboards + ingest). The agent needs only `pip install packscope` in the trainer.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY pyproject.toml README.md LICENSE ./
COPY packscope packscope
COPY agent agent
COPY trainer trainer
COPY backend backend
COPY frontend frontend
COPY alembic alembic
COPY gallery gallery
# The server's extra only: no torch (the base distribution is torch-free; torch comes with the
# [agent] and [trainer] extras, which a server never needs). The build fails if torch slipped in.
RUN pip install '.[server]' \
    && python -c "import importlib.util, sys; sys.exit('torch is installed' if importlib.util.find_spec('torch') else 0)"

EXPOSE 8000
# Migrations run on start (alembic upgrade head), so an empty database is ready at once.
CMD ["packscope", "serve", "--host", "0.0.0.0"]
