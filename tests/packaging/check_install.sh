#!/usr/bin/env bash
# Install proofs, each in a fresh venv (slow: minutes; the server's dependencies come from the
# package registry):
#   (a) for each torch in PACKSCOPE_CHECK_TORCH (default 2.13.0, space-separated): a venv that
#       already holds that torch; `pip install <checkout>` (not editable) and then
#       `pip install '<checkout>[agent]'` leave that torch in place, and packscope.agent imports;
#   (b) a venv with no torch: `pip install '<context>[server]'`, where <context> holds only what
#       the Dockerfile copies, installs no torch, and `packscope serve` answers GET /api/v1/runs.
# Usage: tests/packaging/check_install.sh [WORK_DIR]   (default: a new temporary folder)
# PACKSCOPE_CHECK_ONLY=a or =b runs one half. Prints "check_install: ok" at the end, exits 1 on
# the first failed check.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${1:-$(mktemp -d -t packscope-install.XXXXXX)}
TORCHES=${PACKSCOPE_CHECK_TORCH:-2.13.0}
ONLY=${PACKSCOPE_CHECK_ONLY:-}
PY=${PYTHON:-python3}
mkdir -p "$WORK"
say() { printf 'check_install: %s\n' "$*"; }
fail() { say "FAIL: $*" >&2; exit 1; }

# The sources as a clean copy (tracked and new, unignored files), so that building the wheel
# writes nothing into the checkout.
SRC=$WORK/src
rm -rf "$SRC" && mkdir -p "$SRC"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | xargs -0 cp --parents -t "$SRC")

new_venv() {  # new_venv DIR
  rm -rf "$1"
  "$PY" -m venv "$1"
  "$1/bin/python" -m pip install -q --upgrade pip
}

torch_version() {  # torch_version VENV -> the installed torch's version, or "none"
  "$1/bin/python" -c 'import importlib.metadata as m
try: print(m.version("torch"))
except m.PackageNotFoundError: print("none")'
}

# -- (a) into a training environment ------------------------------------------------------
if [ "$ONLY" != b ]; then
  for t in $TORCHES; do
    V=$WORK/venv-torch-$t
    say "(a) fresh venv with torch==$t: $V"
    new_venv "$V"
    "$V/bin/python" -m pip install -q "torch==$t"
    before=$(torch_version "$V")
    "$V/bin/python" -m pip install -q "$SRC" >"$WORK/pip-a-$t.log" 2>&1 || { cat "$WORK/pip-a-$t.log"; fail "pip install <checkout>"; }
    after=$(torch_version "$V")
    [ "$before" = "$after" ] || fail "pip install <checkout> changed torch: $before -> $after"
    say "(a) pip install <checkout>: torch stays $after"
    "$V/bin/python" -m pip install -q "$SRC[agent]" >>"$WORK/pip-a-$t.log" 2>&1 || { cat "$WORK/pip-a-$t.log"; fail "pip install <checkout>[agent]"; }
    after=$(torch_version "$V")
    [ "$before" = "$after" ] || fail "pip install <checkout>[agent] changed torch: $before -> $after"
    say "(a) pip install '<checkout>[agent]': torch stays $after"
    "$V/bin/python" -m pip check || fail "pip check"
    (cd "$WORK" && "$V/bin/python" -c 'import packscope.agent, packscope.core.flops, torch; print("check_install: (a) packscope.agent imports with torch", torch.__version__)') \
      || fail "import packscope.agent"
  done
fi

# -- (b) the server, without torch ----------------------------------------------------------
if [ "$ONLY" != a ]; then
  # The Docker build context: only what the Dockerfile copies.
  CTX=$WORK/docker-context
  rm -rf "$CTX" && mkdir -p "$CTX"
  grep -E '^COPY ' "$ROOT/Dockerfile" | while read -r _ rest; do
    set -- $rest
    n=$#
    dest=${!n}
    for ((i = 1; i < n; i++)); do
      src=${!i}
      case $dest in
        ./|.) cp -r "$SRC/$src" "$CTX/" ;;
        *) mkdir -p "$CTX/$(dirname "$dest")" && cp -r "$SRC/$src" "$CTX/$dest" ;;
      esac
    done
  done
  V=$WORK/venv-server
  say "(b) fresh venv without torch: $V, installing '<Dockerfile context>[server]'"
  new_venv "$V"
  "$V/bin/python" -m pip install -q "$CTX[server]" >"$WORK/pip-b.log" 2>&1 || { cat "$WORK/pip-b.log"; fail "pip install <context>[server]"; }
  [ "$(torch_version "$V")" = none ] || fail "pip install '[server]' installed torch $(torch_version "$V")"
  if "$V/bin/pip" list 2>/dev/null | grep -iE '^(torch|nvidia-|triton)' ; then fail "torch or CUDA packages in the server venv"; fi
  say "(b) no torch, no nvidia-*, no triton installed"
  "$V/bin/python" -m pip check || fail "pip check"

  port=$("$V/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  (cd "$WORK" && exec "$V/bin/packscope" serve --host 127.0.0.1 --port "$port" \
    --database-url "sqlite:///$WORK/server.db" >"$WORK/serve.log" 2>&1) &
  server=$!
  trap 'kill "$server" 2>/dev/null || true' EXIT
  url=http://127.0.0.1:$port/api/v1/runs
  answer=
  for _ in $(seq 1 120); do
    kill -0 "$server" 2>/dev/null || { cat "$WORK/serve.log"; fail "packscope serve exited"; }
    if command -v curl >/dev/null; then
      answer=$(curl -fsS "$url" 2>/dev/null) && break
    else
      answer=$("$V/bin/python" -c "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())" "$url" 2>/dev/null) && break
    fi
    answer=
    sleep 0.5
  done
  [ -n "$answer" ] || { cat "$WORK/serve.log"; fail "no answer from $url"; }
  say "(b) packscope serve answered GET /api/v1/runs: $(printf '%s' "$answer" | head -c 200)"
  kill "$server"
  wait "$server" 2>/dev/null || true
  trap - EXIT
  say "(b) server stopped"
fi

say ok
