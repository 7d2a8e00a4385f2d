#!/usr/bin/env bash
# Everything that needs a GPU, in three device calls from the repository root (each under 10
# minutes; the last one needs two GPUs). Logs and JSON land in $OUT, then go into one tarball
# so that the device tool brings everything back.
#
#   bash bench/gpu_session.sh tests   # gpu-marked tests with cupti-python 13.0.1; CUPTI tests again with 13.4.0
#   bash bench/gpu_session.sh fixes   # bench/fixes_gpu.sh: legacy logging, channel loss, graphs, profile, chunked CE
#                                     # (SECTIONS=... picks some), with the gallery's run files
#   bash bench/gpu_session.sh graphs  # CUDA graphs vs eager at 2048-token micro-batches (launch-bound), with gallery files
#   bash bench/gpu_session.sh graphs-compiled  # the graphs tests, then the same pairs with torch.compile on both sides
#   bash bench/gpu_session.sh mfu     # the trainer's gpu tests; compiled 1b MFU, separate vs fused projections;
#                                     # where a compiled 1b step goes
#   bash bench/gpu_session.sh multi   # bench/multi_gpu.py: DDP and FSDP2 on 2 GPUs, every rank's records checked
#   bash bench/gpu_session.sh mixed   # cupti-python 13.4 over torch's own libcupti 13.0 (what a --no-deps
#                                     # install gives); multi_gpu.py again with the debug-mode counter
#   bash bench/gpu_session.sh window  # the gpu-marked tests (the sliding-window varlen oracle among them), then
#                                     # a sliding-window 1b counted per window and as full attention (gallery pair;
#                                     # the agent's syncs per step on the windowed runs)
#   bash bench/gpu_session.sh integrations  # bench/integration_overhead.py: the HF Trainer, TRL and Lightning
#                                     # callbacks' host time and ops per step on Qwen2 303M, and their
#                                     # on/off step-time ratios, with and without the sync counter (HOST_INTEGRATIONS,
#                                     # RATIO_INTEGRATIONS, ROUNDS, HOST_STEPS pick less, VARIANTS others, RATIO_SEEDS="0 1 2"
#                                     # one ratio run per seed; BEFORE_ROOT=DIR adds the same for the
#                                     # packscope tree in DIR: git archive <commit> agent packscope | tar -x -C DIR)
#   bash bench/gpu_session.sh shapes  # issue 34: gpu tests with transformers (HF callback, windowed and vision
#                                     # models; two agents in one process), agent_overhead for two presets in one
#                                     # process, the HF callback's ratio for the plain, windowed and vision 303M
#   bash bench/gpu_session.sh vision  # issue 34: the HF callback's ratio on the vision 303M with the garbage
#                                     # collector's time per step recorded, as it runs and with gc.freeze() after
#                                     # warm-up, beside the plain 303M (VISION_RUNS picks others)
#   bash bench/gpu_session.sh sync-cost  # bench/sync_cost.py: one sync inside an HF Trainer run, uncounted
#                                     # and counted (STEPS, default 48)
#   bash bench/gpu_session.sh ledger  # issue 36, one H100 or H200, under 9 minutes: the ledger's gpu tests
#                                     # (tests/gpu/test_gpu_ledger.py, CUPTI), the gallery pairs re-recorded with the
#                                     # CUPTI counter and its trace (legacy logging, channel loss loop, CUDA graphs at
#                                     # 2048x8 = launch-bound, padded vs packed, a slow loader = data wait), the
#                                     # ground-truth test over them (tests/backend/test_gallery_ledger.py) and
#                                     # agent_overhead's on/off ratios with the CUPTI trace on (LEDGER_PAIRS picks
#                                     # pairs by name: logging channel-loss graphs padding data-wait; LEDGER_ROUNDS=3
#                                     # records each pair three times, before and after in turn; LEDGER_OVERHEAD_STEPS
#                                     # the on/off steps per mode, default 150; SKIP_TESTS=1 skips the tests;
#                                     # LEDGER_PROFILE=1 adds a cProfile of the traced agent's calls). `ledger --dry-run`:
#                                     # the same commands on the CPU (tiny preset, few steps, no CUPTI), no install
#   bash bench/gpu_session.sh ledger-small  # issue 36: the 1b legacy-logging and CUDA-graphs (4096x4) pairs, fixes
#                                     # that gain little, with the CUPTI trace, into $OUT/gallery
#   bash bench/gpu_session.sh gaps    # bench/step_gaps.py: the HF callback's switched steps under
#                                     # torch.profiler, where an on-step's extra GPU time sits, gap by gap (ROUNDS,
#                                     # default 12, VARIANTS, default full,core,hook,methods; SEED; GAPS_TIMEOUT)
#
# The device machine has torch but no registry: cupti-python travels as wheels in
# .whl-cupti130/ and .whl-cupti134/ (13.4 brings its libcupti and pyelftools along); transformers,
# TRL and datasets in .whl-integrations/ (bench/integration_wheels.txt says how to fetch them).
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT="${OUT:-/tmp/packscope-gpu}"
mkdir -p "$OUT"
if [[ "${2:-}" == "--dry-run" ]]; then  # the ledger section's commands on this machine's CPU: nothing installed
  ledger_dry_run=1
else
  ledger_dry_run=""
fi
[ -n "$ledger_dry_run" ] || python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
for v in 130 134; do
  [ -n "$ledger_dry_run" ] && break
  if ls ".whl-cupti$v"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "/tmp/cupti$v" \
      ".whl-cupti$v"/*.whl
  fi
done
if [ -z "$ledger_dry_run" ] && ls .whl-cupti134/cupti_python-*.whl >/dev/null 2>&1; then  # the binding alone, torch's libcupti underneath
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/cupti134-binding \
    .whl-cupti134/cupti_python-*.whl .whl-cupti134/pyelftools-*.whl .whl-cupti134/cuda_pathfinder-*.whl
  if ! python3 -c "import cuda.bindings" 2>/dev/null && ls .whl-cupti134/cuda_bindings-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/cupti134-binding \
      .whl-cupti134/cuda_bindings-*.whl
  fi
fi

install_integration_wheels() {  # transformers, TRL, datasets: .whl-integrations/, beside the image's packages
  if ls .whl-integrations/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl-integrations/*.whl 2>&1 | tail -3 | tee "$OUT/integrations_install.txt"
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
}

cupti_probe() {  # which cupti-python and libcupti a process ends up with, and whether it subscribes
  python3 - <<'EOF'
import logging
import torch
torch.zeros(1, device="cuda")
from importlib.metadata import version
from packscope.agent.cupti import CuptiSyncCounter
logging.basicConfig(level=logging.INFO)  # says when subscribe_v2 was refused
counter = CuptiSyncCounter().install()
libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libcupti" in line})
x = torch.ones(4, device="cuda")
x.sum().item()
total, sites = counter.snapshot()
counter.uninstall()
print({"cupti_python": version("cupti-python"), "libcupti": libs,
       "syncs_seen_for_one_item": total})
EOF
}

case "${1:-}" in
  tests)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
    python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)" | tee -a "$OUT/gpus.txt"
    PYTHONPATH=/tmp/cupti130 cupti_probe 2>&1 | tail -3 | tee "$OUT/cupti130_probe.txt"
    PYTHONPATH=/tmp/cupti134 cupti_probe 2>&1 | tail -3 | tee "$OUT/cupti134_probe.txt"
    # 13.0.1 left PyPI in late 2026: where its wheels were not carried, the whole run uses 13.4.0.
    main=/tmp/cupti130; [ -d "$main" ] || main=/tmp/cupti134
    PYTHONPATH=$main timeout 420 python3 -m pytest -m gpu tests/gpu tests/trainer -v -p no:cacheprovider \
      > "$OUT/gpu_tests_all_${main#/tmp/}.log" 2>&1
    tail -3 "$OUT/gpu_tests_all_${main#/tmp/}.log"
    PYTHONPATH=/tmp/cupti134 timeout 90 python3 -m pytest -m gpu tests/gpu -k cupti -v -p no:cacheprovider \
      > "$OUT/gpu_tests_cupti134.log" 2>&1
    tail -3 "$OUT/gpu_tests_cupti134.log"
    ;;
  fixes)
    OUT="$OUT/fixes" bash bench/fixes_gpu.sh
    ;;
  graphs)
    # CUDA graphs where they matter: micro-batches of one 2048-token pack, which leave the GPU
    # waiting on Python's kernel launches (the default 4096x4 step does not); gallery pairs too
    SECTIONS=graphs OUT="$OUT/fixes" PAIR_SUFFIX=-2048x8 GRAPHS_LIMIT=400 \
      GRAPHS_ARGS="--pack-length 2048 --packs-per-step 8 --micro-batches 8 --steps 40" bash bench/fixes_gpu.sh
    ;;
  graphs-compiled)
    # The same with torch.compile on both sides: graphs replay the compiled step
    timeout 240 python3 -m pytest -m gpu tests/trainer/test_trainer_graphs_gpu.py -v -p no:cacheprovider \
      > "$OUT/gpu_tests_graphs.log" 2>&1
    tail -3 "$OUT/gpu_tests_graphs.log"
    SECTIONS=graphs OUT="$OUT/fixes" PAIR_SUFFIX=-compiled-2048x8 GRAPHS_LIMIT=320 \
      GRAPHS_ARGS="--pack-length 2048 --packs-per-step 8 --micro-batches 8 --steps 40 --compile" bash bench/fixes_gpu.sh
    ;;
  mfu)
    timeout 300 python3 -m pytest -m gpu tests/trainer -v -p no:cacheprovider > "$OUT/gpu_tests_trainer.log" 2>&1
    tail -3 "$OUT/gpu_tests_trainer.log"
    timeout 200 python3 bench/fixes_runs.py mfu --presets 1b --steps 25 --pack-length 4096 --packs-per-step 8 \
      --out "$OUT/mfu_1b.json" 2> "$OUT/mfu_1b.err"
    echo "mfu exit $?"
    python3 bench/fixes_runs.py table "$OUT/mfu_1b.json"
    timeout 100 python3 bench/step_profile.py --preset 1b --pack-length 4096 --packs-per-step 8 --compile \
      --fused-projections --out "$OUT/step_profile_1b_compiled.json" > /dev/null 2> "$OUT/step_profile_1b_compiled.err"
    echo "profile exit $?"; tail -25 "$OUT/step_profile_1b_compiled.err"
    ;;
  multi)
    PYTHONPATH=/tmp/cupti130 cupti_probe 2>&1 | tail -3 | tee "$OUT/cupti130_probe.txt"
    PYTHONPATH=/tmp/cupti134 cupti_probe 2>&1 | tail -3 | tee "$OUT/cupti134_probe.txt"
    PYTHONPATH=/tmp/cupti130 timeout 500 python3 bench/multi_gpu.py --out "$OUT/multi_gpu" > "$OUT/multi_gpu.json" \
      2> "$OUT/multi_gpu.err"
    echo "multi_gpu exit $?"; tail -40 "$OUT/multi_gpu.json"; tail -5 "$OUT/multi_gpu.err"
    ;;
  mixed)
    PYTHONPATH=/tmp/cupti134-binding cupti_probe 2>&1 | tail -4 | tee "$OUT/cupti134_binding_probe.txt"
    PYTHONPATH=/tmp/cupti134-binding timeout 90 python3 -m pytest -m gpu tests/gpu -k cupti -v -p no:cacheprovider \
      > "$OUT/gpu_tests_cupti134_binding.log" 2>&1
    tail -3 "$OUT/gpu_tests_cupti134_binding.log"
    timeout 300 python3 bench/multi_gpu.py --out "$OUT/multi_gpu_debug_mode" > "$OUT/multi_gpu_debug_mode.json" \
      2> "$OUT/multi_gpu_debug_mode.err"
    echo "multi_gpu (debug-mode) exit $?"
    ;;
  window)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
    if [ -z "${SKIP_TESTS:-}" ]; then
      PYTHONPATH=/tmp/cupti134-binding timeout 240 python3 -m pytest -m gpu tests/gpu tests/trainer -v -p no:cacheprovider \
        > "$OUT/gpu_tests.log" 2>&1
      tail -3 "$OUT/gpu_tests.log"
    fi
    timeout 240 python3 bench/fixes_runs.py window --presets 1b --steps 30 --pack-length 8192 --packs-per-step 4 --micro-batches 2 \
      --window 4096 --out "$OUT/window_1b.json" --gallery "$OUT/gallery" 2> "$OUT/window_1b.err"
    echo "window exit $?"; tail -4 "$OUT/window_1b.err"
    python3 bench/fixes_runs.py table "$OUT/window_1b.json"
    ;;
  shapes)
    # Issue 34 on a GPU: the gpu-marked tests (the HF callback with a windowed and a vision model,
    # two agents in sequence in one process) with transformers from .whl-integrations/; two presets'
    # agent_overhead ratios in one process (it crashed at the second Trainer); the HF callback's
    # on/off ratio for the plain, windowed and vision 303M models (ROUNDS, default 30).
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
    install_integration_wheels
    python3 -c "import torch, transformers; print('torch', torch.__version__, torch.version.cuda, \
      'transformers', transformers.__version__)" | tee -a "$OUT/gpus.txt"
    timeout 300 python3 -m pytest -m gpu tests/gpu -k "not cupti and not syncs_per_step_agent_on_equals_off" -v -p no:cacheprovider \
      > "$OUT/gpu_tests.log" 2>&1
    tail -3 "$OUT/gpu_tests.log"
    timeout 240 python3 bench/agent_overhead.py --presets 125m,1b --builds eager --steps-per-mode 40 --warmup 4 \
      --out "$OUT/agent_overhead_two_presets.json" > /dev/null 2> "$OUT/agent_overhead_two_presets.err"
    echo "agent_overhead 125m then 1b in one process: exit $?"
    for model in qwen2-303m mistral-303m-window qwen25vl-303m; do
      timeout 240 python3 bench/integration_overhead.py ratio --integrations hf --model "$model" \
        --rounds "${ROUNDS:-30}" --warmup-rounds 5 --out "$OUT/integration_ratio_$model.json" \
        > /dev/null 2> "$OUT/integration_ratio_$model.err"
      echo "ratio hf $model exit $?"
    done
    python3 bench/integration_overhead.py table "$OUT"/integration_ratio_*.json
    ;;
  integrations)
    # The image has torch, numpy, pyarrow, pandas, accelerate and lightning; transformers, TRL and
    # datasets travel in .whl-integrations/ (bench/integration_wheels.txt), installed beside it.
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
    install_integration_wheels
    python3 -c "import torch, transformers, lightning, pyarrow; print('torch', torch.__version__, 'transformers', \
      transformers.__version__, 'lightning', lightning.__version__, 'pyarrow', pyarrow.__version__)" | tee -a "$OUT/gpus.txt"
    python3 -c "import trl, datasets; print('trl', trl.__version__, 'datasets', datasets.__version__)" 2>&1 \
      | tail -1 | tee -a "$OUT/gpus.txt"
    roots=("after:")
    [ -n "${BEFORE_ROOT:-}" ] && [ -d "$BEFORE_ROOT" ] && roots+=("before:$BEFORE_ROOT")
    for entry in "${roots[@]}"; do
      side=${entry%%:*} root=${entry#*:}
      args=(); [ -n "$root" ] && args=(--code-root "$root")
      if [ -n "${HOST_INTEGRATIONS-hf,trl,lightning}" ]; then
        timeout "${HOST_TIMEOUT:-200}" python3 bench/integration_overhead.py host \
          --integrations "${HOST_INTEGRATIONS-hf,trl,lightning}" --steps "${HOST_STEPS:-30}" --op-steps 6 "${args[@]}" \
          --out "$OUT/integration_host_$side.json" > /dev/null 2> "$OUT/integration_host_$side.err"
        echo "host ($side) exit $?"
      fi
      # One process per seed: runs differ by more than one run's interval says (docs/benchmarks/2026-12-02-h200.md).
      for seed in ${RATIO_SEEDS:-0}; do
        [ -n "${RATIO_INTEGRATIONS-hf,trl,lightning}" ] || break
        timeout "${RATIO_TIMEOUT:-900}" python3 bench/integration_overhead.py ratio \
          --integrations "${RATIO_INTEGRATIONS-hf,trl,lightning}" --rounds "${ROUNDS:-70}" --warmup-rounds 5 \
          --seed "$seed" ${VARIANTS:+--variants "$VARIANTS"} "${args[@]}" \
          --out "$OUT/integration_ratio_${side}_seed$seed.json" > /dev/null 2> "$OUT/integration_ratio_${side}_seed$seed.err"
        echo "ratio ($side, seed $seed) exit $?"
      done
    done
    python3 bench/integration_overhead.py table "$OUT"/integration_*.json
    ;;
  gaps)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
    install_integration_wheels
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
      | tee -a "$OUT/gpus.txt"
    timeout "${GAPS_TIMEOUT:-420}" python3 bench/step_gaps.py --rounds "${ROUNDS:-12}" --warmup-rounds 5 \
      --seed "${SEED:-0}" ${VARIANTS:+--variants "$VARIANTS"} \
      --out "$OUT/integration_gaps_seed${SEED:-0}.json" > /dev/null 2> "$OUT/integration_gaps_seed${SEED:-0}.err"
    echo "gaps exit $?"; tail -3 "$OUT/integration_gaps_seed${SEED:-0}.err"
    python3 bench/integration_overhead.py table "$OUT"/integration_gaps_*.json
    ;;
  vision)
    # Issue 34's last line: the vision model's own steps vary by several percent (the plain model's
    # by a tenth of that), too much to resolve 0.1%. The runs record the garbage collector's time per
    # step (a host pause inside a step that synchronizes mid-way lengthens it); the A/A variant "null"
    # (no callback, under another name) shows what the estimator gives on this model when nothing differs.
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
    install_integration_wheels
    # each: model, rounds, then any more arguments of the ratio mode
    runs=("qwen25vl-303m 40" "qwen25vl-303m 80 --gc-freeze" "qwen2-303m 40 --gc-freeze")
    if [ -n "${VISION_RUNS:-}" ]; then IFS=';' read -ra runs <<< "$VISION_RUNS"; fi  # "M N [ARGS]; ..."
    for run in "${runs[@]}"; do
      set -- $run
      model=$1 rounds=$2
      shift 2
      name="integration_ratio_${model}$(echo "$*" | tr -c 'a-z0-9\n' '_' | sed 's/^_*/_/;s/_*$//')"
      timeout 200 python3 bench/integration_overhead.py ratio --integrations hf --model "$model" --rounds "$rounds" \
        --warmup-rounds 5 "$@" --out "$OUT/$name.json" > /dev/null 2> "$OUT/$name.err"
      echo "ratio hf $run: exit $?"
    done
    python3 bench/integration_overhead.py table "$OUT"/integration_ratio_*.json
    ;;
  ledger)
    # Each part has its own time limit; together under 9 minutes on one H100 (the pairs are 125m runs).
    if [ -n "$ledger_dry_run" ]; then
      py=.venv/bin/python; device=cpu; shape="--presets tiny --steps 8 --log-every 2 --pack-length 256"
      backend="--sync-backend debug-mode"; padded_shape="$shape"; launch_shape=""
      overhead=""
    else
      py=python3; device=cuda; shape="--presets 125m --steps 50 --log-every 5"
      backend="--sync-backend cupti"
      padded_shape="$shape --pack-length 1024 --packs-per-step 16"
      launch_shape="$shape --pack-length 2048 --packs-per-step 8 --micro-batches 8"
      overhead=${LEDGER_OVERHEAD-1}  # LEDGER_OVERHEAD= (empty): the pairs alone
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
      main=/tmp/cupti130; [ -d "$main" ] || main=/tmp/cupti134
      export PYTHONPATH=$main
      if ! python3 -c "from cupti import cupti" 2>/dev/null; then  # no wheels carried: the pairs still record
        echo "NO cupti-python (carry .whl-cupti130/ or .whl-cupti134/ for this python): pairs without the trace," \
          "their sync and launch-bound terms not measured" | tee "$OUT/NO_CUPTI.txt"
        backend="--sync-backend debug-mode"
      fi
      if [ -z "${SKIP_TESTS:-}" ]; then
        timeout 150 python3 -m pytest -m gpu tests/gpu/test_gpu_ledger.py tests/gpu/test_gpu_agent.py -v \
          -p no:cacheprovider > "$OUT/gpu_tests_ledger.log" 2>&1
        echo "[gpu tests] exit $?"; tail -3 "$OUT/gpu_tests_ledger.log"
      fi
    fi
    gallery="$OUT/gallery"; mkdir -p "$gallery"
    ledger_pair() {  # ledger_pair FIX SECONDS args...: one before/after pair into $OUT/gallery
      local fix=$1 limit=$2; shift 2
      [[ " ${LEDGER_PAIRS:-$fix} " == *" $fix "* ]] || return 0  # LEDGER_PAIRS="logging data-wait" picks some
      local t0=$SECONDS
      local rounds=${LEDGER_ROUNDS:-1}  # each pair this many times, before and after in turn
      timeout "$((limit * rounds))" $py bench/fixes_runs.py "$fix" --device $device $backend --count-syncs-every 1 \
        --rounds "$rounds" --gallery "$gallery" --out "$OUT/ledger_$fix.json" "$@" 2> "$OUT/ledger_$fix.err"
      echo "[$fix] exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/sections.log"
    }
    ledger_pair logging 70 $shape --eager-only
    ledger_pair channel-loss 60 $shape
    [ -n "$ledger_dry_run" ] || ledger_pair graphs 110 $launch_shape --pair-suffix=-2048x8  # CUDA graphs: a GPU only
    ledger_pair padding 70 $padded_shape
    ledger_pair data-wait 50 $shape --loader-delay-ms 80
    $py bench/gallery_pairs.py "$gallery"/*.jsonl > "$OUT/gallery_pairs.json" 2> "$OUT/gallery_pairs.err"
    echo "[gallery_pairs] exit $?"
    # The ground truth over the new files needs the server's packages (FastAPI, SQLAlchemy, psycopg),
    # which the GPU machine's image lacks: there it says so, and the test runs where the server does.
    if $py -c "import fastapi, sqlalchemy, psycopg" 2>/dev/null; then
      PACKSCOPE_GALLERY_DIR="$gallery" timeout 60 $py -m pytest tests/backend/test_gallery_ledger.py -v -rs \
        -p no:cacheprovider > "$OUT/gallery_ledger_test.log" 2>&1
      echo "[gallery ledger test] exit $?"; grep -E "PASS|FAIL|SKIP|Error|predicted" "$OUT/gallery_ledger_test.log" | head -20
    else
      echo "[gallery ledger test] not run: no server packages here; on the development machine, over the files" \
        "returned: PACKSCOPE_GALLERY_DIR=DIR/gallery .venv/bin/python -m pytest tests/backend/test_gallery_ledger.py" \
        | tee "$OUT/gallery_ledger_test.log"
    fi
    if [ -n "$overhead" ]; then
      timeout 300 python3 bench/agent_overhead.py --builds eager --steps-per-mode "${LEDGER_OVERHEAD_STEPS:-150}" --warmup 16 --cupti \
        --out "$OUT/agent_overhead_ledger.json" > /dev/null 2> "$OUT/agent_overhead_ledger.err"
      echo "[agent_overhead] exit $?"
      python3 - "$OUT/agent_overhead_ledger.json" <<'EOF' 2>&1 | tail -30
import json, sys
r = json.load(open(sys.argv[1]))["step_time_125m_eager"]
for mode, ratios in r["ratios"].items():  # on/off step-time ratios, each with its bootstrap 95% interval
    print(mode, {kind: [round(v["ratio"], 5), [round(x, 5) for x in v["ci95"]]] for kind, v in ratios.items()})
print("ledger fields of full+cupti:", json.dumps(r["ledger_fields"].get("full+cupti", [])[:3]))
for mode, kinds in r.get("agent_calls_by_kind", {}).items():  # where the agent's mean host time goes
    print(mode, {k: [v["steps"], round(v["mean_us"]), round(v["us_per_step_of_all"])] for k, v in kinds.items()})
EOF
      if [ -n "${LEDGER_PROFILE:-}" ]; then  # where the traced agent's step_end time goes, by function
        timeout 200 python3 bench/agent_overhead.py --builds eager --steps-per-mode 60 --warmup 16 --cupti \
          --profile-mode full+cupti --out "$OUT/agent_overhead_profile.json" > /dev/null 2> "$OUT/agent_overhead_profile.err"
        echo "[agent_overhead profile] exit $?"
      fi
    fi
    ;;
  ledger-small)
    # Issue 36's other direction: fixes that gain little (1b legacy logging, 1b CUDA graphs at 4096x4)
    # recorded with the CUPTI trace, for the ground-truth test's "predict little too".
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
    main=/tmp/cupti130; [ -d "$main" ] || main=/tmp/cupti134
    export PYTHONPATH=$main
    gallery="$OUT/gallery"; mkdir -p "$gallery"
    for fix in logging graphs; do
      extra=(); [ "$fix" = logging ] && extra=(--eager-only)
      t0=$SECONDS
      timeout 200 python3 bench/fixes_runs.py "$fix" --device cuda --sync-backend cupti --count-syncs-every 1 \
        --presets 1b --steps 40 --log-every 5 "${extra[@]}" --gallery "$gallery" --out "$OUT/ledger_${fix}_1b.json" \
        2> "$OUT/ledger_${fix}_1b.err"
      echo "[$fix 1b] exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/sections.log"
    done
    ;;
  sync-cost)
    install_integration_wheels
    timeout "${SYNC_COST_TIMEOUT:-300}" python3 bench/sync_cost.py --steps "${STEPS:-48}" --out "$OUT/sync_cost.json" \
      2> "$OUT/sync_cost.err" | tail -40
    echo "sync-cost exit ${PIPESTATUS[0]}"
    ;;
  *)
    echo "usage: bash bench/gpu_session.sh tests|fixes|graphs|graphs-compiled|mfu|multi|mixed|window|integrations|gaps|sync-cost|ledger [--dry-run]|ledger-small" >&2
    exit 2
    ;;
esac
tar -czf /tmp/results.tgz -C "$OUT" . && mv /tmp/results.tgz "$OUT/results.tgz"
