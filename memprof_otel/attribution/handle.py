"""What the layers above attribution know of an instrumented model: the handle contract, both ways.

A framework adapter (``attribution/torch/``) builds handles that satisfy ``ModelHandle``; the
composition root (``runtime``), the endpoint (``http``), the dump service and the exporters only use
what is written here, so none of them imports an adapter or its framework. The live handles are in
``live_handles.py``.

What a handle tells the layers above during a forward is ``ForwardObserver``: the OOM flight
recorder (``dumps``) and the OpenTelemetry recorder (``export``) are observers, and the composition
root adds them to every handle it connects (``add_observer``). A handle calls its observers in the
thread that ran the forward, after its own bookkeeping; an observer that raises is counted in the
handle's hook errors and the model never sees it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from ..timeline import OperationRecord, Sample
from .forward_state import ForwardState
from .stats import LayerMemoryStats
from .windows import WindowFigures

if TYPE_CHECKING:  # types only: the layers below attribution that a handle carries
    from ..capacity.service import Capacity
    from ..config import Config
    from ..dumps.capture import Capture
    from .measure_window import MeasureWindow
    from ..sources.survivors import SurvivorTable

ProcessHistory = Callable[[], tuple[list[Sample], list[OperationRecord]]]


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


class ModelHandle(Protocol):
    """One instrumented model, whatever its framework."""

    name: str                          # the ``model`` label, unique in the process
    config: Config
    last_device: str                   # ``cpu``, ``cuda:0``: where its last forward ran
    capacity: Capacity | None          # its memory model (None with ``capacity.enabled: false``)
    survivors: SurvivorTable | None    # storages born in its forwards and alive (leak detection)
    unattributed: dict[str, int]       # attributed forwards whose figures were dropped, by reason
    events_dropped: int
    process_history: ProcessHistory    # set by the composition root, for export_timeline()
    current_operation: Callable[[], str | None]  # set by the composition root: a capture's label

    @property
    def model(self) -> Any: ...
    @property
    def paused(self) -> bool: ...
    @property
    def layer_count(self) -> int: ...
    @property
    def overhead_seconds(self) -> float: ...
    @property
    def attributed_forwards(self) -> int: ...

    def layer_stats(self) -> dict[str, LayerMemoryStats]: ...
    def surviving(self) -> dict[tuple[str, str], int]: ...
    def exported_layer_peaks(self, now: float | None = None) -> dict[str, WindowFigures]: ...
    def layer_forward_totals(self) -> dict[str, tuple[float, int]]: ...
    def headroom(self, **features: int) -> dict[str, Any]: ...
    def capture(self, forwards: int = 1) -> Capture: ...
    def measure_window(self, forwards: int) -> MeasureWindow:
        """Attribute every model forward, kept per shape, until ``forwards`` were kept (a live baseline)."""
    def end_window(self, win: MeasureWindow) -> None: ...
    def status(self) -> dict[str, Any]:
        """Its line in ``GET /v1/status``: device, layers, paused, forwards, attributed forwards,
        attribution seconds, hook and forward errors."""
    def object_paths(self) -> dict[int, str]:
        """``id(layer object) -> layer path`` for every layer of the model (tracked or not): how an
        exception's traceback is mapped to the layer that raised."""
    def held_tensors(self) -> dict[str, dict[tuple[str, int], int]]:
        """``{"weights": ..., "kv_cache": ...}``: ``(device, storage key) -> bytes`` of what the model
        holds (the memory breakdown's components); empty where the adapter cannot tell."""
    def layer_signatures(self) -> dict[str, str]:
        """Path -> structural signature of every layer (``GET /v1/layers``, baselines)."""
    def environment(self) -> dict[str, str | None]:
        """The facts the figures depend on: device, framework versions, attention kernel."""
    def add_observer(self, observer: ForwardObserver) -> None: ...
    def uninstrument(self) -> None: ...


__all__ = ["FlightListener", "ForwardObserver", "ModelHandle", "ProcessHistory"]
