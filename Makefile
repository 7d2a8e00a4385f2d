# Two commands do all set-up on a fresh machine (Python, git and the package registries):
#   make demo   - server on the embedded SQLite default + two reference training runs feeding it
#   make test   - `npm ci` where node_modules is stale, then the whole test suite (slow tests
#                 included) on 4 pytest-xdist workers (TEST_WORKERS), then the few tests marked
#                 `alone` by themselves, each pass with its 15 slowest tests; the
#                 dashboard's pure JS modules under node:test (tests/js, Node 20+); then
#                 torchtitan's integration tests in an environment of their own (.venv-torchtitan), and
#                 Gemma 3n's timm vision tower tests in another (.venv-timm)
# and, for developers:
#   make lint       - ruff check, ruff format --check and mypy (configured in pyproject.toml), then
#                     eslint over frontend/static and tests/js (eslint.config.js) and TypeScript's check of its JSDoc
#                     types (jsconfig.json, jsconfig.pure.json); `npm ci` installs both from package-lock.json
#   make test-fast  - the suite without the tests marked slow
#   make vendor-plotly - builds plotly.js's bundle of the three trace types the pages draw from the
#                     package that package-lock.json pins (after `npm ci`; frontend/plotly_bundle.mjs)
#                     into frontend/vendor/, where it is committed: the server serves it, npm is not
#                     needed to run the dashboard (tests/test_vendored_plotly.py holds the two equal)
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=
# Workers of the parallel pass. More than the cores pays: many tests wait on servers, subprocesses
# and chromium. --dist loadfile keeps a module's tests on one worker, as in a serial run: its module
# fixtures (servers, chromium) are built once, and what one test leaves there the next one sees.
TEST_WORKERS ?= 4
XDIST   := -n $(TEST_WORKERS) --dist loadfile
PYTEST  := $(BIN)/python -m pytest --durations=15
# The tests marked `alone` hold wall-clock bounds that a busy machine could break: after the parallel
# pass they run by themselves (exit status 5: PYTEST_ARGS selected none of them, which is fine).
define run_tests
	$(PYTEST) $(XDIST) -m "$(1) and not alone" $(PYTEST_ARGS)
	$(PYTEST) -m "$(1) and alone" $(PYTEST_ARGS) || [ $$? = 5 ]
endef

.PHONY: demo test test-fast lint serve bench clean vendor-plotly

# torch is installed first, at the release these machines carry as a CPU wheel (2.13.0); the
# project itself only asks for torch>=2.6 (the [agent] extra), which that release satisfies, so
# `-e .[dev]` then installs no other torch. Elsewhere any torch >= 2.6 does.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# torchtitan 0.3.0 pins datasets<4.8 and huggingface-hub<2, which [dev]'s transformers cannot share:
# its integration tests run in an environment of their own, with the same CPU torch.
TT_VENV  := .venv-torchtitan
TT_STAMP := $(TT_VENV)/.installed
$(TT_STAMP): pyproject.toml
	$(PY) -m venv $(TT_VENV)
	$(TT_VENV)/bin/python -m pip install -q --upgrade pip
	$(TT_VENV)/bin/python -m pip install -q torch==2.13.0
	$(TT_VENV)/bin/python -m pip install -q -e '.[torchtitan]' pytest
	touch $(TT_STAMP)

# timm needs torchvision, which PyPI builds only beside its own torch, not the CPU 2.13.0 above
# ("operator torchvision::nms does not exist"): Gemma 3n's vision tower (timm's MobileNet-V5, through
# transformers) is tested in an environment of its own, with the torch and torchvision that import
# together (CUDA builds of 2.14.1 / 0.29.1, run on the CPU here) and the releases the counts were checked on.
TIMM_VENV  := .venv-timm
TIMM_STAMP := $(TIMM_VENV)/.installed
$(TIMM_STAMP): pyproject.toml
	$(PY) -m venv $(TIMM_VENV)
	$(TIMM_VENV)/bin/python -m pip install -qq --upgrade pip
	$(TIMM_VENV)/bin/python -m pip install -qq torch==2.14.1 torchvision==0.29.1
	$(TIMM_VENV)/bin/python -m pip install -qq -e '.[hf]' transformers==5.25.0 timm==1.0.31 pytest
	touch $(TIMM_STAMP)

# The dashboard's dev tools and the pinned plotly.js package, from package-lock.json: the tests check
# the committed bundle against it byte for byte, make lint runs its eslint and tsc.
NODE_STAMP := node_modules/.package-lock.json
$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund

demo: $(STAMP)
	$(BIN)/packscope demo

serve: $(STAMP)
	$(BIN)/packscope serve

# Browser tests drive Debian's chromium; install it when missing and we may.
test: $(STAMP) $(TT_STAMP) $(TIMM_STAMP) $(NODE_STAMP)
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium for the browser tests"; \
		(apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)); \
	fi
	$(call run_tests,not gpu)
	@echo "the dashboard's pure modules, under node:test:"
	node --test tests/js/
	@echo "torchtitan's integration, in $(TT_VENV):"
	$(TT_VENV)/bin/python -m pytest -p no:cacheprovider tests/agent/test_integrations_torchtitan.py
	@echo "Gemma 3n's timm vision tower, in $(TIMM_VENV) (there its tests run, not skip):"
	$(TIMM_VENV)/bin/python -c "import timm, torchvision"
	$(TIMM_VENV)/bin/python -m pytest -p no:cacheprovider tests/agent/test_gemma3n.py

# -m replaces pyproject's `-m "not gpu"`, so gpu stays deselected in both targets.
test-fast: $(STAMP)
	$(call run_tests,not gpu and not slow)

# All five run, whatever the first ones find; the target fails if any did. eslint and tsc come from
# node_modules (`npm ci`, pinned by package-lock.json); without them those steps fail and say so.
ESLINT := node_modules/.bin/eslint
TSC    := node_modules/.bin/tsc
lint: $(STAMP)
	@status=0; \
	echo "ruff check"; $(BIN)/ruff check . || status=1; \
	echo "ruff format --check"; $(BIN)/ruff format --check . || status=1; \
	echo "mypy"; $(BIN)/python .ci/typecheck.py || status=1; \
	echo "eslint"; \
	if [ -x $(ESLINT) ]; then $(ESLINT) frontend/static frontend/plotly_bundle.mjs tests/js || status=1; \
	else echo "eslint is not installed: run \`npm ci\` (Node 20.19+) to install it into node_modules/" >&2; status=1; fi; \
	echo "tsc (JSDoc types)"; \
	if [ -x $(TSC) ]; then $(TSC) -p jsconfig.json || status=1; $(TSC) -p jsconfig.pure.json || status=1; \
	else echo "tsc is not installed: run \`npm ci\` (Node 20.19+) to install it into node_modules/" >&2; status=1; fi; \
	exit $$status

vendor-plotly: $(NODE_STAMP)
	node frontend/plotly_bundle.mjs frontend/vendor/plotly.min.js
	cp node_modules/plotly.js/LICENSE frontend/vendor/plotly-LICENSE

bench: $(STAMP)
	$(BIN)/python bench/agent_overhead.py

# The venv and node_modules, build outputs, tool caches, and the demo's database (the server's
# default, sqlite:///./packscope.db, with its WAL files, its migration lock and its live-push sockets).
clean:
	rm -rf $(VENV) $(TT_VENV) $(TIMM_VENV) *.egg-info build dist .pytest_cache .mypy_cache .ruff_cache .hypothesis node_modules
	rm -f packscope.db packscope.db-* packscope.db.migrate-lock
	rm -rf packscope.db.live
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
