#!/usr/bin/env bash
# Set up everything (scripts/setup.sh), then lint, type-check and run the whole test suite except `gpu` tests and
# the `full` sizes of tests that run at a smoke size here (`-m full` runs those); the ten slowest tests are listed
# at the end, so a test that outgrows CI's time is seen the run it does.
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
echo "[sao test] pytest -m 'not gpu and not full'" >&2
.venv/bin/python -m pytest -m "not gpu and not full" --timeout=1800 --durations=10 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "[sao test] FAILED: pytest collected no tests (exit 5)" >&2
  exit 1
fi
exit "$rc"
