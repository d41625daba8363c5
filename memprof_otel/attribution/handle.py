"""What the layers above attribution know of an instrumented model: the handle contract.

A framework adapter (``attribution/torch/``) builds handles that satisfy ``ModelHandle``; the
composition root (``runtime``), the endpoint (``http``), the dump service and the exporters only use
what is written here, so none of them imports an adapter or its framework. The live handles are in
``registry.py``; what a handle tells the layers above during a forward is ``observers.py``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..timeline import OperationRecord, Sample
from .stats import LayerMemoryStats
from .windows import WindowFigures

if TYPE_CHECKING:  # types only: the layers below attribution that a handle carries
    from ..capacity.service import Capacity
    from ..config import Config
    from ..dumps.capture import Capture
    from ..sources.survivors import SurvivorTable
    from .observers import ForwardObserver

ProcessHistory = Callable[[], tuple[list[Sample], list[OperationRecord]]]


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

    def layer_stats(self) -> dict[str, LayerMemoryStats]: ...
    def surviving(self) -> dict[tuple[str, str], int]: ...
    def exported_layer_peaks(self, now: float | None = None) -> dict[str, WindowFigures]: ...
    def layer_forward_totals(self) -> dict[str, tuple[float, int]]: ...
    def headroom(self, **features: int) -> dict[str, Any]: ...
    def capture(self, forwards: int = 1) -> Capture: ...
    def status(self) -> dict[str, Any]:
        """Its line in ``GET /v1/status``: device, layers, paused, forwards, attributed forwards,
        attribution seconds, hook and forward errors."""
    def object_paths(self) -> dict[int, str]:
        """``id(layer object) -> layer path`` for every layer of the model (tracked or not): how an
        exception's traceback is mapped to the layer that raised."""
    def layer_signatures(self) -> dict[str, str]:
        """Path -> structural signature of every layer (``GET /v1/layers``, baselines)."""
    def environment(self) -> dict[str, str | None]:
        """The facts the figures depend on: device, framework versions, attention kernel."""
    def add_observer(self, observer: ForwardObserver) -> None: ...
    def uninstrument(self) -> None: ...


__all__ = ["ModelHandle", "ProcessHistory"]
