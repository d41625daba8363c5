"""Every integration test runs with a process runtime of its own and leaves none running: no
sampler, no exporter, no instrumented model; operation records, counters and kept samples start
empty in the next test (a runtime keeps them for the life of a process)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import memprof_otel as mp
from memprof_otel import runtime as runtime_module
from memprof_otel.attribution.live_handles import live_handles

from .support.helpers import JSON_HEADERS


def _fresh_runtime() -> None:
    # the singleton replaced, not cleared field by field: a field added later starts fresh too.
    # One still running (a module fixture's) is shut down first: its sampler would read the shared
    # sources through every later test
    old = runtime_module._runtime
    if old is not None and old.running:
        old.shutdown(2.0)
    runtime_module._runtime = runtime_module.Runtime()


@pytest.fixture(autouse=True)
def clean_runtime():
    _fresh_runtime()
    yield
    for h in list(live_handles().values()):
        h.uninstrument()
    mp.shutdown(2)
    _fresh_runtime()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[mp.Server]:
    """The endpoint on a free port over a fast sampler (50 ms) and a dump folder of the test's own;
    a module with other needs defines its own ``server``."""
    mp.start_monitoring({"sampler": {"interval": "50ms"}, "dumps": {"dir": str(tmp_path / "dumps")}})
    srv = mp.serve(port=0)
    yield srv
    srv.close()


@pytest.fixture
def client(server: mp.Server) -> Iterator[httpx.Client]:
    """An HTTP client on the module's own ``server`` fixture, sending JSON like the CLI does."""
    with httpx.Client(base_url=server.url, timeout=30, headers=JSON_HEADERS) as c:
        yield c
