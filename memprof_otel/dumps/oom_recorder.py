"""The OOM flight recorder: when a forward raises an out-of-memory error, keep what led to it.

It counts the OOM, finds the failing layer (from the attribution stack when the forward was being
attributed, else from the traceback's module frames), and stores a dump with the last samples, the
open operations and the layer's stats, and the OOM's cause with the figures that decide it and
the knob to change (``oom/cause.py``; the figures are gathered by the ``explain`` function the
composition root hands it, which reads the memory model and the leak watch). It never swallows or changes the exception: it observes the
forward's end, and the error continues up the caller's stack as it was. It is a forward observer
(``attribution/handle.py``) that the composition root registers on every handle, and
reads the process history (``FlightSources``) and stores its dump through the functions it was
built with.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from .._log import rate_limited
from ..oom import is_oom
from ..timeline import OperationRecord, Sample
from .store import DumpInfo


class ObservedModel(Protocol):
    """An instrumentation handle as the recorder sees it (``Instrumentation`` is one)."""

    name: str
    last_device: str

    def object_paths(self) -> dict[int, str]: ...
    def layer_stats(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class FlightSources:
    """What a flight record carries of the process, read when the OOM is recorded."""

    samples: Callable[[], list[Sample]]              # the sampler's recent samples
    operations: Callable[[], list[OperationRecord]]  # the operation records (the open ones are kept)
    # where the memory went at the last sampler tick (GET /v1/memory's document); None: not carried
    memory: Callable[[], dict[str, Any]] | None = None


LAST_SAMPLES = 30


def failing_layer(h: ObservedModel, exc: BaseException) -> str | None:
    """The innermost module of ``h``'s model on the exception's traceback, as a module path."""
    paths = h.object_paths()
    if not paths:
        return None
    found = None
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if owner is not None and id(owner) in paths:
            found = paths[id(owner)]
        tb = tb.tb_next
    return found


class OomRecorder:
    """``flight``: what the record carries of the process; ``count_oom(device)``: counts an OOM the
    device's allocator does not count itself; ``store(doc, kind, model)``: stores the flight record
    (the dump service's ``store_json``); ``explain(h, exc)``: the OOM's cause (``Cause.to_dict()``),
    None where nothing explains."""

    def __init__(self, flight: FlightSources, count_oom: Callable[[str], None],
                 store: Callable[[dict[str, Any], str, str], DumpInfo | None],
                 explain: Callable[[Any, BaseException], dict[str, Any] | None] | None = None) -> None:
        self._flight = flight
        self._count_oom = count_oom
        self._store = store
        self._explain = explain
        self.records: list[dict[str, Any]] = []

    def forward_begin(self, h: ObservedModel, state: Any) -> None:
        return None

    def forward_done(self, h: ObservedModel, state: Any, raised: bool, exc: BaseException | None) -> None:
        if not raised or not is_oom(exc):
            return
        assert exc is not None
        device = h.last_device
        if not device.startswith("cuda"):  # CUDA's allocator counts its own OOMs (num_ooms)
            self._count_oom(device)
        layer = failing_layer(h, exc)
        samples = self._flight.samples()[-LAST_SAMPLES:]
        doc = {
            "kind": "oom", "model": h.name, "device": device, "time": time.time(),
            "failing_layer": layer, "exception": f"{type(exc).__name__}: {exc}"[:2000],
            "samples": [s.to_dict() for s in samples],
            "open_operations": [r.to_dict() for r in self._flight.operations() if r.open],
            "layer_stats": {k: v.to_dict() for k, v in h.layer_stats().items()},
            "cause": self._cause(h, exc),
        }
        if self._flight.memory is not None:
            try:
                doc["memory"] = self._flight.memory()
            except Exception as e:  # noqa: BLE001 - the flight record goes out without it
                doc["memory"] = {"error": repr(e)}
        info = self._store(doc, "oom", h.name)
        doc["dump_id"] = info.id if info is not None else None
        self.records.append(doc)
        del self.records[:-20]
        cause = doc["cause"] or {}
        rate_limited.warning("oom", "memprof_otel: %s raised out-of-memory in layer %r on %s: %s (%s); flight "
                             "record %s", h.name, layer, device, cause.get("cause", "unknown"),
                             cause.get("knob", ""), doc["dump_id"])

    def _cause(self, h: ObservedModel, exc: BaseException) -> dict[str, Any] | None:
        """The cause, or None: gathering its figures never stops the record being kept."""
        if self._explain is None:
            return None
        try:
            return self._explain(h, exc)
        except Exception as e:
            rate_limited.warning("oom-cause", "memprof_otel: the OOM's cause could not be read: %r", e)
            return None

    def last_cause(self) -> dict[str, Any] | None:
        """The latest OOM record's cause with when and where it happened (the advice cites it)."""
        for doc in reversed(self.records):
            if doc.get("cause"):
                return {"source": "oom", "time": doc["time"], "model": doc["model"], "device": doc["device"],
                        "dump_id": doc.get("dump_id"), **doc["cause"]}
        return None

    def capture_done(self, h: ObservedModel, cap: Any) -> None:
        return None

    def uninstrumented(self, h: ObservedModel) -> None:
        return None
