"""What an instrumentation handle tells the layers above it, without importing them.

The OOM flight recorder (``dumps``) and the OpenTelemetry recorder (``export``) register here; the
composition root (``runtime``) adds them to every handle it connects (``add_observer``). A handle
calls its observers in the thread that ran the forward, after its own bookkeeping; an observer that
raises is counted in the handle's hook errors and the model never sees it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol

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


class FlightListener(Protocol):
    """Hears of every forward, attributed or not, while it is in flight (the black box). Called in
    the forward's thread at its opening and its end: both must be cheap and never raise."""

    def opened(self, model: str, root: str, features: Mapping[str, int] | None, state: Any) -> int:
        """A forward of ``model`` opened at the module ``root`` ("" the model's root), with its shape
        features (None when the memory model is off) and its ``ForwardState`` when attributed
        (else None); returns a token for ``closed``."""

    def closed(self, token: int) -> None:
        """The forward ``opened`` returned ``token`` for has ended (returned, raised or abandoned)."""


__all__ = ["FlightListener", "ForwardObserver"]
