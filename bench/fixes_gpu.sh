#!/usr/bin/env bash
# The published fixes as before/after runs on one H200, in one device call from the repository
# root (about 8 minutes; every section has its own time limit so the whole stays under 9).
# JSON and logs land in $OUT; the short table comes last.
#   (b) per-channel loss: per-document loop vs vectorized      channel_loss.json
#   (d) where a 1b step's time goes (torch.profiler)            step_profile_1b.json
#   (e) chunked cross-entropy off/on, 1b                        chunked_ce.json
#   (c) CUDA graphs vs eager, static THD, 125m and 1b           graphs.json
#   (a) legacy vs fixed logging, eager and compiled, 125m, 1b   logging_125m.json, logging_1b.json
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT="${OUT:-/tmp/packscope-fixes}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
section() {  # section NAME SECONDS command...: run it with a time limit, its stderr to NAME.err
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" 2> "$OUT/$name.err"
  echo "[$name] exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/sections.log"
}
section channel_loss 60 python3 bench/channel_loss.py --out "$OUT/channel_loss.json" > /dev/null
section step_profile_1b 70 python3 bench/step_profile.py --preset 1b --pack-length 4096 --packs-per-step 4 \
  --out "$OUT/step_profile_1b.json" > /dev/null
section chunked_ce 55 python3 bench/fixes_runs.py chunked-ce --presets 1b --steps 30 --out "$OUT/chunked_ce.json"
section graphs 85 python3 bench/fixes_runs.py graphs --presets 125m,1b --steps 30 --out "$OUT/graphs.json"
section logging_125m 85 python3 bench/fixes_runs.py logging --presets 125m --steps 60 --out "$OUT/logging_125m.json"
section logging_1b 150 python3 bench/fixes_runs.py logging --presets 1b --steps 40 --out "$OUT/logging_1b.json"

echo; tail -12 "$OUT/channel_loss.err"
echo; tail -17 "$OUT/step_profile_1b.err"
echo
python3 bench/fixes_runs.py table "$OUT/chunked_ce.json" "$OUT/graphs.json" "$OUT/logging_125m.json" "$OUT/logging_1b.json" \
  | tee "$OUT/table.txt"
