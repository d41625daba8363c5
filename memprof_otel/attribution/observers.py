"""What an instrumentation handle tells the layers above it, without importing them.

The OOM flight recorder (``dumps``) and the OpenTelemetry recorder (``export``) register here; the
composition root (``runtime``) adds them to every handle it connects (``add_observer``). A handle
calls its observers in the thread that ran the forward, after its own bookkeeping; an observer that
raises is counted in the handle's hook errors and the model never sees it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .forward_state import ForwardState

if TYPE_CHECKING:  # types only
    from ..dumps.capture import Capture
    from .handle import ModelHandle


class ForwardObserver(Protocol):
    def forward_begin(self, h: ModelHandle, state: ForwardState) -> None:
        """An attributed forward starts."""

    def forward_done(self, h: ModelHandle, state: ForwardState | None, raised: bool,
                     exc: BaseException | None) -> None:
        """A forward ended (``state`` None when it was not attributed; ``exc`` what it raised)."""

    def capture_done(self, h: ModelHandle, cap: Capture) -> None:
        """A deep capture of ``h`` completed all its forwards (not called when cancelled)."""

    def uninstrumented(self, h: ModelHandle) -> None:
        """``h`` was just uninstrumented: its figures are final (the OTel recorder hands them to
        the next export, so a job that uninstruments before shutting down still exports them)."""


__all__ = ["ForwardObserver"]
