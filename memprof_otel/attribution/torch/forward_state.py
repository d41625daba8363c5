"""One attributed forward in one thread: the per-layer hook sink and its counter.

Created by the pre-hook of the module that opens the forward (the root, or a submodule called
directly) when the scheduler picks it, fed by the global module hooks (``hooks.py``) for every
module call of that thread, closed by that module's post-hook. Nothing here
raises into the model: every failure is counted on the owning instrumentation and logged
rate-limited.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Protocol

from ..peaks import LayerCall, PeakTracker
from ...sources.base import Reading


class HotCounter(Protocol):
    """What the tracker reads on every hook: a ledger (CPU) or an allocator source (CUDA)."""

    def read_and_reset(self) -> Reading: ...  # pragma: no cover - protocol
    def reset_peak(self) -> None: ...  # pragma: no cover - protocol


class ForwardState:
    __slots__ = ("paths", "root_key", "root_path", "counter", "tracker", "calls", "events", "origin_s", "baseline",
                 "on_error", "self_time_s", "listener")

    def __init__(self, paths: dict[int, str], root_key: int, root_path: str, counter: HotCounter, origin_s: float,
                 baseline: int, on_error: Callable[[str, BaseException], None],
                 record_events: bool) -> None:
        self.paths = paths
        self.root_key = root_key    # the module whose call opened this forward (the model's root,
        self.root_path = root_path  # or a submodule called directly, e.g. an encoder in generate())
        self.counter = counter
        self.tracker = PeakTracker()
        self.calls: list[LayerCall] = []
        self.events: list[dict[str, Any]] | None = [] if record_events else None
        self.origin_s = origin_s
        self.baseline = baseline
        self.on_error = on_error
        self.self_time_s = 0.0
        self.listener: Any = None  # a deep capture's per-layer observer, when one runs

    def begin(self, now_s: float) -> None:
        self.counter.reset_peak()
        self._enter(self.root_path, self.root_key, now_s)

    def enter(self, module: Any) -> None:
        t = time.perf_counter()
        try:
            key = id(module)
            path = self.paths.get(key)
            if path is not None and key != self.root_key:
                self._enter(path, key, t)
                if self.listener is not None:
                    self.listener.enter(path, module, t)
        except Exception as e:  # never into the model
            self.on_error("layer_enter", e)
        self.self_time_s += time.perf_counter() - t

    def exit(self, module: Any, raised: bool = False) -> None:
        t = time.perf_counter()
        try:
            key = id(module)
            if key != self.root_key and key in self.paths:
                self._exit(key, t, raised)
                if self.listener is not None:
                    self.listener.exit(self.paths[key], module, t)
        except Exception as e:
            self.on_error("layer_exit", e)
        self.self_time_s += time.perf_counter() - t

    def finish(self, now_s: float, raised: bool) -> list[LayerCall]:
        """Close the root frame (and any frame a failing hook left open); returns every call."""
        self._exit(self.root_key, now_s, raised)
        self.tracker.clear()
        return self.calls

    def _enter(self, path: str, key: int, t: float) -> None:
        r = self.counter.read_and_reset()
        self.tracker.enter(path, key, r, t)
        if self.events is not None:
            self.events.append({"t": t - self.origin_s, "type": "layer_enter", "layer": path,
                                "allocated_bytes": r.allocated + self.baseline})

    def _exit(self, key: int, t: float, raised: bool) -> None:
        r = self.counter.read_and_reset()
        closed = self.tracker.exit(key, r, t, raised)
        self.calls.extend(closed)
        if self.events is not None:
            for c in closed:
                self.events.append({"t": t - self.origin_s, "type": "layer_exit", "layer": c.path,
                                    "allocated_bytes": r.allocated + self.baseline,
                                    "peak_increase_bytes": c.peak_increase, "retained_bytes": c.retained,
                                    "duration_ms": c.duration_s * 1000.0, "raised": c.raised})
