#!/usr/bin/env bash
# The published fixes as before/after runs on one H200, in one device call from the repository
# root (about 8 minutes; every section has its own time limit so the whole stays under 9).
# JSON and logs land in $OUT; the short table comes last.
#   (b) per-channel loss: per-document loop vs vectorized      channel_loss.json
#   (d) where a 1b step's time goes (torch.profiler)            step_profile_1b.json
#   (e) chunked cross-entropy off/on, 1b                        chunked_ce.json
#   (c) CUDA graphs vs eager, static THD, 125m and 1b           graphs.json
#   (a) legacy vs fixed logging, eager and compiled, 125m, 1b   logging_125m.json, logging_1b.json
#   (f) channel loss in training: loop vs vectorized, 125m      channel_loss_runs.json
# Every before/after run of (a), (c) and (f) is also kept as a run file in $OUT/gallery (the
# demo's gallery; `packscope import` loads them). SECTIONS picks sections (default: all).
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT="${OUT:-/tmp/packscope-fixes}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
SECTIONS="${SECTIONS:-channel_loss step_profile_1b chunked_ce graphs logging_125m logging_1b channel_loss_runs}"
GALLERY="$OUT/gallery"
section() {  # section NAME SECONDS command...: run it with a time limit, its stderr to NAME.err
  local name=$1 limit=$2; shift 2
  [[ " $SECTIONS " == *" $name "* ]] || return 0
  local t0=$SECONDS
  timeout "$limit" "$@" 2> "$OUT/$name.err"
  echo "[$name] exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/sections.log"
}
section channel_loss 60 python3 bench/channel_loss.py --out "$OUT/channel_loss.json" > /dev/null
section step_profile_1b 70 python3 bench/step_profile.py --preset 1b --pack-length 4096 --packs-per-step 4 \
  --out "$OUT/step_profile_1b.json" > /dev/null
section chunked_ce 55 python3 bench/fixes_runs.py chunked-ce --presets 1b --steps 30 --out "$OUT/chunked_ce.json"
# GRAPHS_ARGS: another step shape for the graphs section; PAIR_SUFFIX tells its gallery pairs apart
section graphs "${GRAPHS_LIMIT:-110}" python3 bench/fixes_runs.py graphs --presets 125m,1b ${GRAPHS_ARGS:---steps 40} --out "$OUT/graphs.json" \
  --gallery "$GALLERY" --pair-suffix="${PAIR_SUFFIX:-}"
section logging_125m 110 python3 bench/fixes_runs.py logging --presets 125m --steps 100 --out "$OUT/logging_125m.json" \
  --gallery "$GALLERY"
section logging_1b 160 python3 bench/fixes_runs.py logging --presets 1b --steps 40 --out "$OUT/logging_1b.json" \
  --gallery "$GALLERY"
section channel_loss_runs 90 python3 bench/fixes_runs.py channel-loss --presets 125m --steps 40 \
  --out "$OUT/channel_loss_runs.json" --gallery "$GALLERY"

[ -f "$OUT/channel_loss.err" ] && { echo; tail -12 "$OUT/channel_loss.err"; }
[ -f "$OUT/step_profile_1b.err" ] && { echo; tail -17 "$OUT/step_profile_1b.err"; }
echo
python3 bench/fixes_runs.py table "$OUT/chunked_ce.json" "$OUT/graphs.json" "$OUT/logging_125m.json" "$OUT/logging_1b.json" \
  "$OUT/channel_loss_runs.json" \
  | tee "$OUT/table.txt"
