"""Every integration test leaves the process runtime (a singleton) as it found it: no sampler, no
exporter, no instrumented model, no operation records."""
from __future__ import annotations

import pytest

import memprof_otel as mp
from memprof_otel.attribution.torch.instrumentation import live_instrumentations
from memprof_otel.runtime import runtime


def _reset() -> None:
    rt = runtime()
    rt.tracker.end_phase()
    rt.tracker.clear()
    rt.op_stats.clear()


@pytest.fixture(autouse=True)
def clean_runtime():
    _reset()
    yield
    for h in list(live_instrumentations().values()):
        h.uninstrument()
    mp.shutdown(2)
    _reset()
