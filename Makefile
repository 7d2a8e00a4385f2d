# Two commands do all set-up on a fresh machine (Python, git and the package registries):
#   make demo   - server on the embedded SQLite default + two reference training runs feeding it
#   make test   - the whole test suite
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test serve bench clean

# torch is pinned first: on these machines 2.13.0 is a CPU wheel; a looser range pulls a
# multi-GB CUDA build. The project's own range (2.11-2.13) then installs nothing more.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/packscope demo

serve: $(STAMP)
	$(BIN)/packscope serve

# Browser tests drive Debian's chromium; install it when missing and we may.
test: $(STAMP)
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium for the browser tests"; \
		(apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)); \
	fi
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/agent_overhead.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache packscope-demo.db*
