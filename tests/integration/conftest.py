"""Every integration test leaves the process runtime (a singleton) as it found it: no sampler, no
exporter, no instrumented model, no operation records."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import memprof_otel as mp
from memprof_otel.attribution.registry import live_handles
from memprof_otel.runtime import runtime

from .helpers import JSON_HEADERS


def _reset() -> None:
    rt = runtime()
    rt.tracker.end_phase()
    rt.tracker.clear()
    rt.op_stats.clear()
    # OOMs seen in forwards count for the life of the process (a counter); one test's OOMs must
    # not become the next test's critical advice
    rt.extra_ooms.clear()
    rt.discard_samples()  # a stopped sampler's samples stay readable: not into the next test


@pytest.fixture(autouse=True)
def clean_runtime():
    _reset()
    yield
    for h in list(live_handles().values()):
        h.uninstrument()
    mp.shutdown(2)
    _reset()


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
