"""Deep capture: the next N forwards of a model, every allocation attributed to module path + op.

``Instrumentation.capture(forwards=N)`` returns a ``Capture`` at once. The next N forwards are
attributed whatever the scheduler says; on each of them the tensor ledger (also pushed on CUDA
models, for the per-op view) reports every fresh storage to the capture with the op that made it,
and the per-layer hooks report module entries and exits. Presentation is separate: ``speedscope()``
turns what was recorded into a speedscope document through the pure builder.

Where no per-op view exists (Keras on TensorFlow or JAX: no dispatch to hook), a capture made with
``per_op=False`` weighs each innermost layer call by its peak increase instead: the frame of a
layer with sublayers is then the sum of its sublayers' needs, the memory of ops between them unseen.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from .._version import __version__
from ..errors import MemprofError
from ..files import write_json_atomic
from .speedscope import balanced_calls, build_speedscope


class LayerCall(Protocol):
    """What a capture reads of a closed layer call (``attribution.peaks.LayerCall`` has it; this
    layer sits below attribution, so it names the fields rather than importing the class)."""
    @property
    def path(self) -> str: ...
    @property
    def entry_level(self) -> int: ...
    @property
    def peak_level(self) -> int: ...


class Capture:
    def __init__(self, model_name: str, forwards: int, max_records: int = 2_000_000, *,
                 per_op: bool = True) -> None:
        if isinstance(forwards, bool) or not isinstance(forwards, int) or not 1 <= forwards <= 1000:
            raise ValueError(f"forwards must be an int in [1, 1000], got {forwards!r}")
        self.model_name = model_name
        self.forwards = forwards
        self.max_records = max_records
        self.completed = 0
        self.dropped = 0
        self.created_unix = time.time()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._busy = False
        self._stack: list[str] = []
        self.allocations: list[tuple[tuple[str, ...], int]] = []
        self.calls: list[tuple[str, str, float]] = []
        self.cancelled = False
        self.failed: str | None = None  # why it ended before its forwards (uninstrumented, ...)
        self.history: Any = None                      # CUDA allocator-history recorder (CUDA only)
        self.cuda_snapshot: dict[str, Any] | None = None
        self.per_op = per_op
        self.measure = "bytes allocated" if per_op else "peak increase of innermost layer calls"
        # per_op=False: beside each open frame, "no sublayer called inside it yet"
        self._innermost: list[bool] = []

    # ---- what users call -------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once it is over: the N forwards captured, or ended early (``failed`` says why);
        False if ``timeout`` passed first. (``CaptureTimeout`` is the dump service's error, for
        ``POST /v1/dumps`` and ``memprof-otel dump``, which wait for you.)"""
        return self._done.wait(timeout)

    def cancel(self, reason: str | None = None) -> None:
        with self._lock:
            self.cancelled = True
            if reason is not None and self.failed is None:
                self.failed = reason
        self._stop_history()
        self._done.set()

    def _stop_history(self) -> None:
        history = self.history
        if history is not None and self.cuda_snapshot is None:
            self.cuda_snapshot = history.stop()

    def speedscope(self) -> dict[str, Any]:
        """The captured forwards as a speedscope document; ``MemprofError`` before the first one
        completed (an empty profile would look like a model that allocates nothing)."""
        if self.completed == 0:
            why = (f": {self.failed}" if self.failed else
                   " yet: run a forward of the model (wait() returns once the forwards are in)")
            raise MemprofError(f"no forward of {self.model_name!r} was captured{why}")
        with self._lock:
            allocations = list(self.allocations)
            calls = balanced_calls(self.calls)
        return build_speedscope(f"{self.model_name} ({self.completed} forward"
                                f"{'s' if self.completed != 1 else ''})", allocations, calls,
                                exporter=f"memprof-otel {__version__}", measure=self.measure)

    def save(self, path: str | os.PathLike[str]) -> None:
        write_json_atomic(self.speedscope(), path)

    def total_bytes(self) -> int:
        with self._lock:
            return sum(n for _, n in self.allocations)

    # ---- what the instrumentation calls ----------------------------------------------------
    def claim(self) -> bool:
        """Take the next forward, unless another thread's forward is being captured or we are done."""
        with self._lock:
            if self._busy or self._done.is_set():
                return False
            self._busy = True
            return True

    def forward_started(self, t: float) -> None:
        self._stack = [self.model_name]
        self._innermost = [True]
        self.calls.append(("O", self.model_name, t))

    def forward_finished(self, t: float, root: LayerCall | None = None) -> None:
        """The forward ended; ``root`` is its root call's figures (``per_op=False``: the root's
        peak increase weighs the forward when no sublayer was called)."""
        if not self.per_op and root is not None and self._innermost[:1] == [True]:
            self._weigh((self.model_name,), root)
        with self._lock:
            while self._stack:
                self.calls.append(("C", self._stack.pop(), t))
            self.completed += 1
            self._busy = False
            finished = self.completed >= self.forwards
        if finished:
            self._stop_history()  # before done is set: a waiter sees the snapshot
            self._done.set()

    def on_alloc(self, func: Any, nbytes: int) -> None:
        if len(self.allocations) >= self.max_records:
            self.dropped += 1
            return
        self.allocations.append(((*self._stack, _op_name(func)), nbytes))

    def enter(self, path: str, module: Any, t: float) -> None:
        self._stack.append(path)
        self.calls.append(("O", path, t))
        if not self.per_op:
            if self._innermost:
                self._innermost[-1] = False
            self._innermost.append(True)

    def exit(self, path: str, module: Any, t: float, closed: Sequence[LayerCall] = ()) -> None:
        """``closed``: the calls the exit closed, innermost first (their figures)."""
        if path not in self._stack:
            return
        if not self.per_op and closed and closed[0].path == path and self._stack[-1] == path \
                and self._innermost[-1:] == [True]:
            self._weigh(tuple(self._stack), closed[0])
        while self._stack:
            top = self._stack.pop()
            if self._innermost:
                self._innermost.pop()
            self.calls.append(("C", top, t))
            if top == path:
                break

    def _weigh(self, stack: tuple[str, ...], call: LayerCall) -> None:
        if len(self.allocations) >= self.max_records:
            self.dropped += 1
            return
        self.allocations.append((stack, max(0, call.peak_level - call.entry_level)))


def _op_name(func: Any) -> str:
    try:
        return f"{func.namespace}::{func._opname}" + ("" if func._overloadname == "default" else f".{func._overloadname}")
    except AttributeError:
        return str(func)
