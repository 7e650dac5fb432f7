#!/usr/bin/env bash
# Set up everything (scripts/setup.sh), then lint, type-check and run the whole test suite except `gpu` tests.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
export SAO_CACHE="${SAO_CACHE:-$HOME/.cache/sao}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$SAO_CACHE/torch_extensions}"
echo "[sao test] ruff" >&2
.venv/bin/ruff check . || exit 1
.venv/bin/ruff format --check . || exit 1
echo "[sao test] mypy" >&2
.venv/bin/mypy || exit 1
echo "[sao test] pytest -m 'not gpu'" >&2
.venv/bin/python -m pytest -m "not gpu" --timeout=1800 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "[sao test] FAILED: pytest collected no tests (exit 5)" >&2
  exit 1
fi
exit "$rc"
