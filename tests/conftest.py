import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest

from tests import framework_venvs

# real models load from site-packages only; never reach for a hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# series.layers defaults to "auto": every layer, unless the process runs in a Kubernetes pod. The
# suite expects a laptop's behaviour wherever CI runs (its children inherit this); the pod case is
# tested with an explicit environment (tests/unit/telemetry/test_series_budget.py)
os.environ.pop("KUBERNETES_SERVICE_HOST", None)

# capacity.mmap_threshold defaults to "auto": under a memory limit (a cgroup's, or
# capacity.limit_bytes, which many tests set) glibc's mmap threshold is fixed at 1/128 of it, process-
# wide and for good. Tests that set a limit would otherwise change the heap behind the figures of
# every later test in the same worker. The suite keeps glibc's own policy everywhere; the tests of
# the setting pass it explicitly, and the OOM cgroup tests' children drop this to get the shipped
# default.
os.environ.setdefault("MEMPROF_OTEL_CAPACITY_MMAP_THRESHOLD", "off")

# One intra-op thread per process: the suite runs on two pytest workers, most of its tests start
# interpreters of their own, and each of them used every core for its small models' operations —
# threads that spent more CPU waiting on each other than computing (a GPT-2 test took 88 CPU s
# on two threads, 37 on one). No figure the suite checks depends on the thread count; a test that
# needs more threads sets them itself (the OOM cgroup test's child runs on two). The children
# inherit the variable; torch, if a plugin imported it already, is told directly.
if "OMP_NUM_THREADS" not in os.environ:  # a value the caller set is theirs, and torch read it already
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)

# ---- the order of the files, and the side venvs the test command builds while the suite runs ----

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the longest files first, then those that need a side venv, then the rest (tests/framework_venvs.py);
    # pytest-xdist hands the files out in this order (--no-loadscope-reorder)
    paths = [item.nodeid.split("::", 1)[0] for item in items]  # the file, relative to the rootdir
    items[:] = [items[i] for i in framework_venvs.file_order(paths)]


_venv_failures: dict[str, str] = {}


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    # Outside pytest-timeout's hook (tryfirst; a conftest's wrapper is entered before the plugin's):
    # waiting for a venv being built is no part of a test's time limit.
    marker = item.get_closest_marker(framework_venvs.MARKER)
    if marker is not None and marker.args[0] not in _venv_failures:
        try:
            framework_venvs.wait_for_build(marker.args[0])
            _venv_failures[marker.args[0]] = ""
        except framework_venvs.VenvBuildFailed as e:
            _venv_failures[marker.args[0]] = str(e)
    yield


@pytest.fixture(scope="module", autouse=True)
def _framework_venv_built(request: pytest.FixtureRequest) -> None:
    """A module whose side venv failed to build fails with the build's log (it is never skipped),
    before its own module fixtures start that venv's interpreter (an autouse fixture comes first)."""
    marker = request.node.get_closest_marker(framework_venvs.MARKER)
    if marker is not None and _venv_failures.get(marker.args[0]):
        pytest.fail(_venv_failures[marker.args[0]], pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def _temp_dir_of_its_own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each test file gets a temp dir of its own (TMPDIR for the processes it starts, and this
    process's ``tempfile``), removed after it. The defaults that live there are per host and per
    service: a process that starts reports, from ``<temp dir>/memprof-otel-blackbox-<service>``, any
    process of its service that ended without a clean shutdown before it — on a shared temp dir
    that was another file's process, killed at its teardown, landing in this file's dump folder. A
    short path under the usual temp dir (Unix socket paths there stay within their 107 bytes)."""
    tmp_path_factory.getbasetemp()  # pytest's own folder stays where it is (found on first use)
    saved_env, saved_module = os.environ.get("TMPDIR"), tempfile.tempdir
    own = tempfile.mkdtemp(prefix="memprof-t-")
    os.environ["TMPDIR"] = tempfile.tempdir = own
    try:
        yield
    finally:
        tempfile.tempdir = saved_module
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(own, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_runtime_left_running() -> Iterator[None]:
    """A test that instruments a model starts the process runtime, whose sampler reads the
    process-wide sources every second until shut down. Left running, it outlives its test on that
    worker: it costs CPU through the rest of the run, and its reads land in later tests that
    replace those sources (one saw a scrape "read" a source the stopped sampler never asked for).
    The integration tests shut theirs down themselves; any other test's is shut down here."""
    yield
    module = sys.modules.get("memprof_otel.runtime")  # never imported here for a test that did not
    rt = getattr(module, "_runtime", None)
    if rt is not None and rt.running:
        rt.shutdown(2.0)
        module._runtime = None
