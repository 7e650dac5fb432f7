#!/usr/bin/env bash
# The prepared GPU check (docs/gpu.md): on a lent GPU machine, install the carried wheels, run the `gpu` tests and
# measure one SAO learner step of a dense and an MoE model; print the table and write it with the logs under $OUT.
#   bash scripts/gpu_check.sh --prepare   here, with a package index: build the wheels into .gpu_wheels/ (ignored)
#                                         and check that the working tree plus them stays under the 64 MiB that travel
#   bash scripts/gpu_check.sh             on the GPU machine (one H200, no network); ends within GPU_CHECK_BUDGET_S
#   bash scripts/gpu_check.sh --cpu       the same code on this CPU machine: tiny models, short sequences, no install
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=.gpu_wheels
LIMIT_MIB=64
# Packages the GPU path needs that the GPU machine's image lacks (deepspeed and its pydantic; pytest-asyncio, which
# the pytest config names) and those that pin a newer version of something the image has (pytest-asyncio needs
# pytest >= 8.4, pydantic a recent typing-extensions). pip there takes from these only what it is missing.
CARRY=(deepspeed hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions
  pytest pluggy iniconfig pytest-asyncio pytest-timeout)
# What pip installs there (their needs come from the folder, the rest from what is installed).
TOP=(deepspeed pytest-asyncio pytest-timeout)

log() { echo "[gpu check] $*" >&2; }
# pip warns once per package about a local find-links folder some machines configure; keep real messages only.
quiet_pip() { "$PY" -m pip "$@" 2> >(grep -v "^WARNING: Location '" >&2); }

mode=gpu
case "${1:-}" in
  "") ;;
  --cpu) mode=cpu ;;
  --prepare) mode=prepare ;;
  *) echo "usage: bash scripts/gpu_check.sh [--prepare | --cpu]  (see docs/gpu.md)" >&2; exit 2 ;;
esac

travel_bytes() {  # what the device tool sends: tracked and untracked-not-ignored files, plus the wheel folder
  { git ls-files -z --cached --others --exclude-standard; find "$WHEELS" -type f -print0 2>/dev/null; } \
    | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}'
}

if [ "$mode" = prepare ]; then
  PY="${PYTHON:-.venv/bin/python}"
  [ -x "$PY" ] || { log "no $PY: run \`bash scripts/setup.sh\` first (the wheels pin the versions tested here)"; exit 1; }
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  pins=()
  for p in "${CARRY[@]}"; do
    v=$("$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$p") \
      || { log "$p is not installed in $PY; run \`bash scripts/setup.sh\`"; exit 1; }
    pins+=("$p==$v")
  done
  log "building ${pins[0]} as a pure-python wheel (its ops JIT-build on the GPU machine)"
  DS_BUILD_OPS=0 quiet_pip wheel -q --no-deps -w "$WHEELS" "${pins[0]}" || { log "pip wheel ${pins[0]} failed"; exit 1; }
  log "downloading Python 3.12 wheels: ${pins[*]:1}"
  quiet_pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" "${pins[@]:1}" \
    || { log "pip download failed (see above)"; exit 1; }
  for p in "${TOP[@]}"; do printf '%s\n' "${pins[@]}" | grep -i "^$p=="; done > "$WHEELS/requirements.txt"
  bad=$(find "$WHEELS" -name '*.whl' ! -name '*-py3-none-any.whl' ! -name '*-cp312-*' | head -1)
  [ -z "$bad" ] || { log "$bad is neither pure-python nor built for CPython 3.12"; exit 1; }
  total=$(travel_bytes)
  log "$(ls "$WHEELS" | wc -l) files in $WHEELS ($(du -sk "$WHEELS" | cut -f1) KiB); the run sends $((total / 1024)) KiB"
  [ "$total" -lt $((LIMIT_MIB * 1048576)) ] || { log "that is over the ${LIMIT_MIB} MiB that travel: carry less"; exit 1; }
  exit 0
fi

OUT="${OUT:-runs/gpu_check}"
mkdir -p "$OUT"
BUDGET="${GPU_CHECK_BUDGET_S:-420}"  # the whole run; the device tool's call gets a minute more (docs/gpu.md)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "$mode" = cpu ]; then
  PY="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
  export SAO_CACHE="${SAO_CACHE:-$HOME/.cache/sao}"
  TESTS_S=120 BENCH_S=300  # caps for a loaded 2-core machine; ~1 min on a quiet one
else
  PY="${PYTHON:-python3}"
  export SAO_CACHE="${SAO_CACHE:-/tmp/sao_cache}"  # nothing under $OUT but the report files
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"  # JIT-build DeepSpeed's fused Adam for Hopper only
  TESTS_S=150 BENCH_S=240
fi
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$SAO_CACHE/torch_extensions}"
unset RANK WORLD_SIZE LOCAL_RANK MASTER_PORT

parts=""
part() {  # part NAME CAP_S CMD...: run CMD under `timeout` (CAP_S, or what the budget leaves), log to $OUT/NAME.log
  local name=$1 cap=$2 left lim t0 rc
  shift 2
  left=$((BUDGET - SECONDS - 15))  # 15 s stay for the report
  lim=$((cap < left ? cap : left))
  if [ "$lim" -lt 20 ]; then
    log "$name: not run (${left} s of the ${BUDGET} s budget left)"
    parts+=" $name=skip:0"
    return
  fi
  t0=$SECONDS
  log "$name (at most ${lim} s) ..."
  timeout -k 10 "$lim" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  parts+=" $name=$rc:$((SECONDS - t0))"
  log "$name: exit $rc after $((SECONDS - t0)) s (log: $OUT/$name.log)"
}

if [ "$mode" = gpu ]; then
  if [ ! -f "$WHEELS/requirements.txt" ]; then
    log "no $WHEELS/requirements.txt: run \`bash scripts/gpu_check.sh --prepare\` where a package index is reachable, and carry $WHEELS"
    parts+=" install=1:0"
  else
    part install 90 "$PY" -m pip install --no-index --find-links "$WHEELS" -r "$WHEELS/requirements.txt"
  fi
fi
# Only the plugins the tests use: the GPU image has others (xdist, cov, benchmark) that a pytest upgraded by the
# install may not load.
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 part tests "$TESTS_S" "$PY" -m pytest -p pytest_asyncio.plugin -p pytest_timeout \
  -p no:cacheprovider -m gpu --timeout="$TESTS_S" --junitxml="$OUT/tests.xml" \
  tests/integration/trainer/test_gpu.py tests/integration/cluster/test_gpu_cluster.py
# A JIT build cut by the tests' timeout leaves its lock file, on which the bench's build would wait forever (on the
# GPU machine only: elsewhere the op cache is shared with other processes that may be building).
[ "$mode" = gpu ] && find "$TORCH_EXTENSIONS_DIR" -name lock -type f -delete 2>/dev/null
bench_args=(--out "$OUT")
[ "$mode" = cpu ] && bench_args+=(--cpu)
left=$((BUDGET - SECONDS - 15))
part bench "$BENCH_S" "$PY" -m sao.benchmarks.gpu_check "${bench_args[@]}" --budget-s $(((BENCH_S < left ? BENCH_S : left) - 30))
"$PY" -m sao.benchmarks.gpu_check_report --out "$OUT" --parts "$parts"
