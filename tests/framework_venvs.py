"""The framework venvs (TensorFlow, JAX, LitServe, Ray Serve) that the test command builds while the
suite runs, and the order the suite's files go out in.

``scripts/install-and-test.sh`` starts pytest as soon as ``./.venv`` is ready; the side venvs go on
building meanwhile, each ending by writing its exit status to ``NAME.status`` (its log beside it,
``NAME.log``) in the folder ``MEMPROF_TEST_VENV_BUILDS`` names. A test module that needs one says so
with ``pytest.mark.framework_venv(NAME)``; its tests wait for that status, and fail with the end of
the build's log when the build failed. Without the variable (venvs built beforehand, pytest run
by hand) nothing waits."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

BUILDS_VAR = "MEMPROF_TEST_VENV_BUILDS"
MARKER = "framework_venv"
# a side venv builds in minutes (docs/testing.md); past this something is stuck, and the test says so
WAIT_LIMIT_S = 1800.0
LOG_TAIL_LINES = 30


class VenvBuildFailed(Exception):
    """The side venv a test needs did not build (or not within the limit); the message says why."""


def wait_for_build(name: str, environ: dict[str, str] | None = None, limit_s: float = WAIT_LIMIT_S,
                   poll_s: float = 0.5, sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> None:
    """Return once the side venv ``name`` is built; raise VenvBuildFailed with the end of its log
    when its build failed, or when no status came within ``limit_s`` seconds. Returns at once when
    no build is going on (``MEMPROF_TEST_VENV_BUILDS`` unset)."""
    folder = (os.environ if environ is None else environ).get(BUILDS_VAR)
    if not folder:
        return
    status, log = Path(folder) / f"{name}.status", Path(folder) / f"{name}.log"
    deadline = clock() + limit_s
    while not status.exists():  # written whole, by a rename, when the build ends
        if clock() >= deadline:
            raise VenvBuildFailed(f".venv-{name} was not built within {limit_s:.0f} s:\n{_tail(log)}")
        sleep(poll_s)
    code = status.read_text(encoding="utf-8").strip()
    if code != "0":
        raise VenvBuildFailed(f"building .venv-{name} failed (exit {code}):\n{_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL_LINES:])
    except OSError as e:
        return f"(no log: {e})"


# The files that take longest, measured (docs/testing.md), in the order they go out to the two
# workers: a long file handed out last would run alone at the end while the other worker idles.
# The out-of-memory test first (about two minutes on one worker, its own cgroup), then the other
# long ones; then the files that need a side venv; then every other file, in collection order.
FIRST = (
    "tests/integration/test_oom_cgroup.py",
    "tests/integration/test_oom_cgroup_models.py",      # two more cgroup children, about a minute each
    "tests/integration/test_capacity_real_models.py",
    "tests/integration/test_live_baselines.py",         # ten fresh uvicorn services, about 80 s
    "tests/integration/test_postmortem_history.py",     # a crash loop of real processes, about 70 s
    "tests/integration/test_examples.py",
    "tests/integration/test_demo.py",                   # one demo: its breakdown, families and stop
    "tests/integration/test_memory_breakdown.py",
    "tests/integration/test_compile.py",
    "tests/integration/test_postmortems_in_servers.py",  # uvicorn and gunicorn stopped and killed, about 50 s
    "tests/integration/test_collector_down.py",
    "tests/integration/test_prefork.py",
    "tests/integration/test_cli.py",
    "tests/integration/test_postmortem_cause_back_to_back.py",  # a cgroup OOM, about 25 s
    "tests/unit/test_install_fit.py",
    "tests/integration/test_config_in_containers.py",
    "tests/integration/test_assets_against_demo.py",
    "tests/integration/test_pytest_plugin.py",
    "tests/integration/test_endpoint_hardening.py",
    "tests/integration/test_early_warning.py",
    "tests/integration/test_exact_workloads.py",
    "tests/integration/test_baselines.py",
    "tests/integration/test_dump_folders_across_processes.py",
    "tests/integration/test_heap_diff.py",
    "tests/integration/test_otel_final_export.py",
    "tests/integration/test_leaks.py",
)
# The files that need a side venv, right after the long files, longest first: by then (some ten
# minutes into the suite on two workers) their venvs, built since the suite started, are ready, and
# the two workers' queues end on the many short files that come after, within seconds of each other.
# (At the very end, 10 to 90 s each and held in xdist's queues two at a time, they ended one
# worker's queue 90 s after the other's.)
SIDE_VENV_FILES = (
    "tests/integration/test_keras_tensorflow_backend.py",
    "tests/integration/test_keras_jax_backend.py",
    "tests/integration/test_ray_serve.py",
    "tests/integration/test_litserve.py",
    "tests/integration/test_keras_tf_cpu_statistics.py",
    "tests/integration/test_keras_example.py",
    "tests/integration/test_capacity_keras_mlp.py",
)


def file_order(relpaths: Sequence[str]) -> list[int]:
    """Indexes of ``relpaths`` (each item's file, relative to the repository, in collection order)
    in the order to run them: the files of FIRST in its order, then those of SIDE_VENV_FILES in its
    order, then the rest as collected. A sort key per file, so that a file's items stay together and
    in their own order."""
    listed = FIRST + SIDE_VENV_FILES
    rank = {path: i for i, path in enumerate(listed)}
    return sorted(range(len(relpaths)), key=lambda i: rank.get(relpaths[i], len(listed)))
