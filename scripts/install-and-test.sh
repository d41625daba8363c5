#!/usr/bin/env bash
# Install memprof-otel with everything its tests need into ./.venv, then run the whole suite.
# Safe to re-run: it only installs what is missing. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch first and pinned: a bare or open-ended torch pulls a multi-GB CUDA build
.venv/bin/python -m pip install -q --disable-pip-version-check 'torch==2.13.0'
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[all]'
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
