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
from ..files import write_bytes_atomic, write_json_atomic
from .flame import SIDE_KEY, Flame
from .pprof import build_pprof, is_pprof_path
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
    def __init__(self, model_name: str, forwards: int, max_stacks: int = 200_000, *,
                 per_op: bool = True, device: str | None = None) -> None:
        if isinstance(forwards, bool) or not isinstance(forwards, int) or not 1 <= forwards <= 1000:
            raise ValueError(f"forwards must be an int in [1, 1000], got {forwards!r}")
        self.model_name = model_name
        self.forwards = forwards
        self.max_stacks = max_stacks
        self.completed = 0
        self.dropped = 0  # allocations in stacks beyond the first max_stacks, left out (the title says so)
        self.created_unix = time.time()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._busy = False
        self._stack: list[str] = []
        # stack (model, layer paths..., op) -> [bytes, allocations], in the order first seen. Summed
        # as they come, not kept one row per allocation: a capture's memory follows the distinct
        # stacks (module paths x ops), not the allocations (millions over 1,000 forwards of a big
        # model, ~250 bytes each, held while it is the handle's last capture)
        self._merged: dict[tuple[str, ...], list[int]] = {}
        self.calls: list[tuple[str, str, float]] = []
        self.cancelled = False
        self.failed: str | None = None  # why it ended before its forwards (uninstrumented, ...)
        self.history: Any = None                      # CUDA allocator-history recorder (CUDA only)
        self.cuda_snapshot: dict[str, Any] | None = None
        # the operation each captured forward ran in (None: none): a label when they all agree
        self.operations: set[str | None] = set()
        self.per_op = per_op
        self.device = device      # the model's device when the capture was armed, where known
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

    def _check_completed(self) -> None:
        if self.completed == 0:
            why = (f": {self.failed}" if self.failed else
                   " yet: run a forward of the model (wait() returns once the forwards are in)")
            raise MemprofError(f"no forward of {self.model_name!r} was captured{why}")

    @property
    def allocations(self) -> list[tuple[tuple[str, ...], int]]:
        """``(stack, bytes)`` per distinct stack, summed over the allocations recorded there."""
        return [(stack, v[0]) for stack, v in self._stacks()]

    def _stacks(self) -> list[tuple[tuple[str, ...], tuple[int, int]]]:
        # list() of a dict's items runs in C without releasing the GIL: a forward still recording
        # on another thread cannot change the dict's size under it
        return [(stack, (v[0], v[1])) for stack, v in list(self._merged.items())]

    def _title(self) -> str:
        title = f"{self.model_name} ({self.completed} forward{'s' if self.completed != 1 else ''})"
        if self.dropped:
            title += f"; {self.dropped:,} allocations in stacks beyond the first {self.max_stacks:,} left out"
        return title

    def _recorded(self) -> tuple[list[tuple[tuple[str, ...], tuple[int, int]]], list[tuple[str, str, float]]]:
        """A copy of the stacks and calls recorded (``MemprofError`` before a forward is in)."""
        self._check_completed()
        with self._lock:
            return self._stacks(), list(self.calls)

    def flame(self) -> Flame:
        """What was recorded as the plain data both files are built from: per stack, the bytes and
        the number of allocations (``per_op=False``: the peak increase alone, one sample type)."""
        return self._flame(*self._recorded())

    def _flame(self, recorded: list[tuple[tuple[str, ...], tuple[int, int]]],
               calls: list[tuple[str, str, float]]) -> Flame:
        stacks = tuple(stack for stack, _ in recorded)
        values = tuple(v if self.per_op else v[:1] for _, v in recorded)
        types = (("alloc_space", "bytes"), ("alloc_objects", "count")) if self.per_op else \
            (("peak_increase", "bytes"),)
        labels = [("model", self.model_name)]
        if self.device:
            labels.append(("device", self.device))
        if len(self.operations) == 1 and None not in self.operations:
            labels.append(("operation", next(iter(self.operations))))  # every forward ran in it
        span = (max(t for _, _, t in calls) - min(t for _, _, t in calls)) if calls else 0.0
        return Flame(types, stacks, values, labels=tuple(labels), time_nanos=int(self.created_unix * 1e9),
                     duration_nanos=int(span * 1e9), comments=(f"{self._title()}: {self.measure}",))

    def speedscope(self) -> dict[str, Any]:
        """The captured forwards as a speedscope document; ``MemprofError`` before the first one
        completed (an empty profile would look like a model that allocates nothing). It carries
        what its pprof file needs beyond it under ``memprof_otel`` (see ``flame.py``)."""
        allocations, raw_calls = self._recorded()
        flame = self._flame(allocations, raw_calls)
        doc = build_speedscope(self._title(), flame.weighted(), balanced_calls(raw_calls),
                               exporter=f"memprof-otel {__version__}", measure=self.measure)
        doc[SIDE_KEY] = {"pprof": flame.side_entry()}
        return doc

    def pprof(self) -> bytes:
        """The captured forwards as a gzipped pprof ``Profile`` (``MemprofError`` as ``speedscope``)."""
        return build_pprof(self.flame())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the capture: a pprof file when ``path`` ends in ``.pb.gz`` or ``.pprof``, else a
        speedscope JSON file."""
        if is_pprof_path(path):
            write_bytes_atomic(self.pprof(), path)
        else:
            write_json_atomic(self.speedscope(), path)

    def total_bytes(self) -> int:
        return sum(n for _, n in self.allocations)

    # ---- what the instrumentation calls ----------------------------------------------------
    def claim(self) -> bool:
        """Take the next forward, unless another thread's forward is being captured or we are done."""
        with self._lock:
            if self._busy or self._done.is_set():
                return False
            self._busy = True
            return True

    def forward_started(self, t: float, operation: str | None = None) -> None:
        """A claimed forward begins; ``operation``: the operation it runs in, if any."""
        self.operations.add(operation)
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
        if nbytes > 0:
            self._record((*self._stack, _op_name(func)), nbytes)

    def _record(self, stack: tuple[str, ...], nbytes: int) -> None:
        v = self._merged.get(stack)
        if v is None:
            if len(self._merged) >= self.max_stacks:
                self.dropped += 1
                return
            v = self._merged[stack] = [0, 0]
        v[0] += nbytes
        v[1] += 1

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
        if call.peak_level > call.entry_level:
            self._record(stack, call.peak_level - call.entry_level)


def _op_name(func: Any) -> str:
    try:
        return f"{func.namespace}::{func._opname}" + ("" if func._overloadname == "default" else f".{func._overloadname}")
    except AttributeError:
        return str(func)
