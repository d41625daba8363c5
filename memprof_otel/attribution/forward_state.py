"""One attributed forward in one thread: the per-layer hook sink and its counter.

Created by the pre-hook of the module that opens the forward (the root, or a submodule called
directly) when the scheduler picks it, fed by the global module hooks (``hooks.py``) for every
module call of that thread, closed by that module's post-hook. Nothing here
raises into the model: every failure is counted on the owning instrumentation and logged
rate-limited.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

from .peaks import LayerCall, PeakTracker
from ..sources.base import HotCounter


# Timeline events are kept as tuples (a dict per layer enter/exit made every attributed forward
# cost ~0.3 us and ~400 B per event); ``event_dict`` turns one into its documented JSON shape.
EnterEvent = tuple  # (t_s, "layer_enter", layer, allocated_bytes)
ExitEvent = tuple   # (t_s, "layer_exit", layer, allocated_bytes, peak_increase, retained, duration_s, raised)


def event_dict(e: tuple) -> dict[str, Any]:
    if e[1] == "layer_enter":
        return {"t": e[0], "type": e[1], "layer": e[2], "allocated_bytes": e[3]}
    return {"t": e[0], "type": e[1], "layer": e[2], "allocated_bytes": e[3], "peak_increase_bytes": e[4],
            "retained_bytes": e[5], "duration_ms": e[6] * 1000.0, "raised": e[7]}


def _event_bytes(e: tuple) -> int:
    """Heap bytes one kept event costs: the tuple, its own numbers (layer names and type strings
    are shared with the model's path table) and its slot in the buffer."""
    own = sum(sys.getsizeof(x) for x in e if isinstance(x, (int, float)) and not isinstance(x, bool))
    return sys.getsizeof(e) + own + 8


# measured on representative events (a 4 GiB level needs a 32-byte int, a small one 28)
ENTER_EVENT_BYTES = _event_bytes((1.5, "layer_enter", "x", 1 << 32))
EXIT_EVENT_BYTES = _event_bytes((1.5, "layer_exit", "x", 1 << 32, 1 << 20, 1 << 20, 0.001, False))
# events come in enter/exit pairs, so a count of events maps to bytes through the pair's mean
MEAN_EVENT_BYTES = (ENTER_EVENT_BYTES + EXIT_EVENT_BYTES) // 2


def event_capacity(max_events: int, max_event_bytes: int) -> int:
    """Events the timeline buffer keeps: the smaller of the count and the byte bound."""
    return max(0, min(max_events, max_event_bytes // MEAN_EVENT_BYTES))


_perf_counter = time.perf_counter


class ForwardState:
    __slots__ = ("paths", "root_key", "root_path", "counter", "tracker", "calls", "events", "origin_s", "baseline",
                 "on_error", "self_time_s", "listener", "births", "shared_counter", "overlapped", "lost", "root_only", "kernel", "_read",
                 "_enter_t", "_exit_t")

    def __init__(self, paths: dict[int, str], root_key: int, root_path: str, counter: HotCounter, origin_s: float,
                 baseline: int, on_error: Callable[[str, BaseException], None],
                 record_events: bool) -> None:
        self.paths = paths
        self.root_key = root_key    # the module whose call opened this forward (the model's root,
        self.root_path = root_path  # or a submodule called directly, e.g. an encoder in generate())
        self.counter = counter
        self.tracker = PeakTracker()
        self.calls: list[LayerCall] = []
        self.events: list[tuple] | None = [] if record_events else None
        self.origin_s = origin_s
        self.baseline = baseline
        self.on_error = on_error
        self.self_time_s = 0.0
        self.listener: Any = None  # a deep capture's per-layer observer, when one runs
        # the tensor ledger, when one runs: told the innermost layer on every enter and exit, so
        # each storage it sees born carries its birth layer (surviving bytes per layer)
        self.births: Any = None
        # the counter is the device's (CUDA allocator statistics), not this thread's: the figures
        # hold only if no other forward ran meanwhile; ``overlapped`` says one was open at the start
        self.shared_counter = False
        self.overlapped = False
        self.lost: str | None = None  # why the forward's figures could not be had, if so (trace)
        # a forward the scheduler did not pick, read at its root only for the memory model
        # (capacity.root_readings): not an attributed forward, its figures feed nothing else
        self.root_only = False
        # the root's reading in the units its limit counts (kernel_reading.py): a mark from the
        # start, its figure (or None) once the forward ended
        self.kernel: Any = None
        # bound once: these run on every module call of the forward
        self._read = counter.read_and_reset
        self._enter_t = self.tracker.enter
        self._exit_t = self.tracker.exit

    def begin(self, now_s: float) -> None:
        self.counter.reset_peak()
        self._enter(self.root_path, self.root_key, now_s)

    def enter(self, module: Any) -> None:
        key = id(module)
        path = self.paths.get(key)
        if path is None or key == self.root_key:
            return  # an untracked module (beyond max_depth, excluded): its memory is its parent's
        t = _perf_counter()
        try:
            self._enter(path, key, t)
            if self.listener is not None:
                self.listener.enter(path, module, t)
        except Exception as e:  # never into the model
            self.on_error("layer_enter", e)
        self.self_time_s += _perf_counter() - t

    def exit(self, module: Any, raised: bool = False) -> None:
        key = id(module)
        path = self.paths.get(key)
        if path is None or key == self.root_key:
            return
        t = _perf_counter()
        try:
            closed = self._exit(key, t, raised)
            if self.listener is not None:
                self.listener.exit(path, module, t, closed)
        except Exception as e:
            self.on_error("layer_exit", e)
        self.self_time_s += _perf_counter() - t

    def release(self) -> None:
        """Give back what the forward holds beyond this thread (idempotent); nothing here."""

    def finish(self, now_s: float, raised: bool) -> list[LayerCall]:
        """Close the root frame (and any frame a failing hook left open); returns every call."""
        self._exit(self.root_key, now_s, raised)
        self.tracker.clear()
        return self.calls

    def _enter(self, path: str, key: int, t: float) -> None:
        r = self._read()
        self._enter_t(path, key, r, t)
        if self.births is not None:
            self.births.layer = path
        if self.events is not None:
            self.events.append((t - self.origin_s, "layer_enter", path, r[0] + self.baseline))

    def _exit(self, key: int, t: float, raised: bool) -> list[LayerCall]:
        r = self._read()
        closed = self._exit_t(key, r, t, raised)
        self.calls += closed
        if self.births is not None:
            self.births.layer = self.tracker.innermost()
        if self.events is not None:
            at = t - self.origin_s
            level = r[0] + self.baseline
            for c in closed:
                self.events.append((at, "layer_exit", c[0], level, c[2] - c[1], c[3] - c[1], c[6], c[8]))
        return closed
