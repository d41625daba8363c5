"""What an instrumentation handle tells the layers above it, without importing them.

The OOM flight recorder (``dumps``) and the OpenTelemetry recorder (``export``) register here; the
composition root (``runtime``) adds them to every handle it connects. A handle calls its observers
in the thread that ran the forward, after its own bookkeeping; an observer that raises is counted
in ``hook_errors`` and the model never sees it.
"""
from __future__ import annotations

from typing import Any, Protocol


class ForwardObserver(Protocol):
    def forward_begin(self, h: Any, state: Any) -> None:
        """An attributed forward starts (``state``: its ``ForwardState``)."""

    def forward_done(self, h: Any, state: Any, raised: bool, exc: BaseException | None) -> None:
        """A forward ended (``state`` None when it was not attributed; ``exc`` what it raised)."""

    def capture_done(self, h: Any, cap: Any) -> None:
        """A deep capture of ``h`` completed all its forwards (not called when cancelled)."""

    def uninstrumented(self, h: Any) -> None:
        """``h`` was just uninstrumented: its figures are final (the OTel recorder hands them to
        the next export, so a job that uninstruments before shutting down still exports them)."""
