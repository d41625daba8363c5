"""Phases (``mark_operation``): each mark ends the previous one, also when threads mark at once."""
from __future__ import annotations

import threading
import time

from memprof_otel.telemetry.operations import OperationTracker


class SlowProbe:
    """A probe whose reads take a moment, as a real RSS read under load does: the window in which
    two marks could interleave."""

    def rss(self) -> int:
        time.sleep(0.0005)
        return 1 << 30

    def allocators(self) -> dict[str, int]:
        return {}


def test_marks_from_several_threads_leave_one_phase_open_and_end_phase_ends_it() -> None:
    tracker = OperationTracker(SlowProbe(), max_records=10_000)
    start = threading.Barrier(4)

    def marks(t: int) -> None:
        start.wait()
        for i in range(100):
            tracker.mark(f"phase-{t}-{i}", {})

    threads = [threading.Thread(target=marks, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    phases = [r for r in tracker.records() if r.kind == "phase"]
    assert len(phases) == 400 and sum(r.end is None for r in phases) == 1  # the last mark's
    tracker.end_phase()
    assert all(r.end is not None for r in tracker.records())
