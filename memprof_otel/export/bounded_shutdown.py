"""Shut our OTLP providers down within a deadline, whatever the collector does and however busy the
machine is.

A provider's shutdown makes the final export and waits for it. Against a collector that refuses
connections the SDK's exporter retries with a growing backoff until its own export timeout; against
one that accepts and never answers, a request waits that long. Neither is bounded by the caller's
deadline, so each provider's shutdown runs on a daemon thread of its own (the metrics' final export
never waits for the spans', nor the reverse), all joined against the one deadline. At the deadline
the exporters still exporting are aborted (their ``shutdown()``: no retry after it, the connection
pool closed), so no export goes on retrying once the caller has moved on; a request already on the
wire ends at its own timeout, on a daemon thread that the interpreter's exit does not wait for.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

Step = Callable[[float], None]   # a provider's shutdown, given the seconds left
Abort = Callable[[], None]       # an exporter's shutdown: stops its retries, closes its connections


def shutdown_within(steps: Sequence[Step], aborts: Sequence[Abort], timeout_s: float) -> bool:
    """Run every step at once, each on a daemon thread, and wait for them until ``timeout_s`` has
    passed; then call every abort if one is still running. True if all steps finished in time.
    A step or an abort that raises counts as finished (shutdown never raises)."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    threads = []
    for i, step in enumerate(steps):
        t = threading.Thread(target=_quietly, args=(step, deadline), name=f"memprof-otel-shutdown-{i}",
                             daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if not any(t.is_alive() for t in threads):
        return True
    for abort in aborts:
        try:
            abort()
        except Exception:
            pass
    return False


def _quietly(step: Step, deadline: float) -> None:
    try:
        step(max(0.0, deadline - time.monotonic()))
    except Exception:
        pass
