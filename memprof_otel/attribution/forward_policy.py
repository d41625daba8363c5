"""The per-forward policy, the same on every framework: which forward is measured and how, what a
forward's end is charged to, and the forwards in flight that the flight listeners (the black box)
hear of.

A handle owns one ``ForwardPolicy``; its adapter calls ``choose`` as a forward opens (which calls
back the adapter's ``_begin_attributed`` or ``_begin_root_reading``), ``flight_begin`` and
``flight_end`` around the forward while a flight listener is added, and ``end`` once it folded the
forward's figures. The handle is passed to each call rather than kept: a policy holds no reference
back to its handle. All of it runs once per forward, never per layer call. This module imports no
framework.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Protocol

from ..capacity.service import Capacity
from ..capacity.shapes import Features
from ..config import Config
from ..dumps.capture import Capture
from . import live_handles as live
from .forward_state import ForwardState
from .handle import FlightListener, ForwardObserver, ModelHandle
from .measure_window import MeasureWindow
from .peaks import LayerCall
from .scheduler import AttributionScheduler

_perf_counter = time.perf_counter


class ForwardRecord(threading.local):
    """One thread's forward of a handle, as every adapter keeps it: the adapter subclasses it with
    what its own machinery needs (torch's dispatch mode, Keras' layer-call sink)."""

    depth = 0                          # calls of the opener in flight on this thread (1 when not nested)
    state: ForwardState | None = None  # the forward this thread opened, if measured
    capture: Capture | None = None     # the capture this forward belongs to, if one claimed it
    start_s = 0.0
    self_time_s = 0.0
    opened = 0                         # the forward's opening number (OpenForwards.open)
    shape: Features | None = None      # the measured root forward's shape features (memory model)
    features: Features | None = None   # the forward's shape wherever it was read (an OOM's cause cites it)
    flight: tuple[int, ...] | None = None  # the flight listeners' tokens for this forward (black box)
    on_demand = False                  # attributed because a capture or a measuring window asked for it


class PolicyHost(ModelHandle, Protocol):
    """The handle a policy is passed, with what the policy calls back on it (``Instrumentation`` is
    one): the adapter's two ways to begin a measured forward, and the handle's error-counted calls."""

    def _begin_attributed(self, opener: Any, path: str, t: float, cap: Capture | None,
                          compiled: bool) -> None: ...
    def _begin_root_reading(self, opener: Any, t: float) -> None: ...
    def _notify(self, event: Callable[[ForwardObserver], object]) -> None: ...
    def _count_error(self, where: str, e: BaseException) -> None: ...


class ForwardPolicy:
    """What is measured on which forward of one handle, and what a forward's end is charged to."""

    def __init__(self, config: Config, capacity: Capacity | None) -> None:
        acfg = config.attribution
        ccfg = config.capacity
        self.scheduler = AttributionScheduler(acfg.every_n_forwards, acfg.overhead_budget, acfg.enabled,
                                              ccfg.learning_budget if ccfg.enabled else 0.0)
        self.capacity = capacity  # the handle's memory model (None with capacity.enabled: false)
        self.root_readings = ccfg.root_readings
        # the deep capture taking the next forwards, and the measuring window of a live baseline, while
        # running or open: the handle's capture() and measure_window() set them under live_handles.LOCK
        self.running_capture: Capture | None = None
        self.open_window: MeasureWindow | None = None
        # forwards in flight, attributed or not (the black box); empty: the forward path skips it
        self.flight: list[FlightListener] = []

    # ---- a forward's opening -----------------------------------------------------------------
    def choose(self, h: PolicyHost, tls: ForwardRecord, opener: Any, path: str, t: float, args: Any,
               kwargs: dict[str, Any] | None, compiled: bool = False) -> None:
        """A waiting capture claims the forward, else the scheduler may pick it for attribution
        (``h._begin_attributed``, which leaves ``tls.state`` set when it measures); a model forward
        left plain is read at its root only for the memory model (``h._begin_root_reading``,
        ``capacity.root_readings``); a model forward of a shape the memory model has not measured
        may be attributed beyond the budget (``capacity.learning_budget``,
        ``AttributionScheduler.may_learn``); a measured model forward's shape is read for the memory
        model (a layer's own shapes are not the model's). ``opener``: what the adapter knows the
        opening call by (torch's module, Keras' layer id)."""
        cap = self.running_capture
        win = self.open_window
        scheduler = self.scheduler
        capacity = self.capacity
        tls.shape = None
        tls.on_demand = False
        shape_read = False
        if cap is not None and cap.claim():
            tls.on_demand = True
            h._begin_attributed(opener, path, t, cap, compiled)
        elif win is not None and not path and win.open:  # a measuring window takes every model forward
            tls.on_demand = True
            h._begin_attributed(opener, path, t, None, compiled)
        elif scheduler.should_attribute():
            h._begin_attributed(opener, path, t, None, compiled)
        elif not path and capacity is not None and scheduler.may_learn():
            # a shape the memory model has not measured is worth an attributed forward
            # (scheduler.may_learn): the shape is read now, once, for the decision and the model
            tls.shape, shape_read = self.shape(h, args, kwargs), True
            kind = capacity.new_kind(tls.shape) if tls.shape else None
            if kind is None:
                scheduler.known()
            elif scheduler.claim(kind):
                h._begin_attributed(opener, path, t, None, compiled)
        if tls.state is None and not path and capacity is not None and self.root_readings:
            h._begin_root_reading(opener, t)
        if tls.state is not None and not path and capacity is not None and not shape_read:
            tls.shape = self.shape(h, args, kwargs)
        tls.features = tls.shape

    def shape(self, h: PolicyHost, args: Any, kwargs: dict[str, Any] | None) -> Features | None:
        """The forward's shape features for the memory model (``capacity`` on), None when a user's
        ``shape_of`` raised: counted, the forward unmodelled."""
        try:
            return self.capacity.features(tuple(args), kwargs or {})  # type: ignore[union-attr]
        except Exception as e:
            self.capacity.shape_errors += 1  # type: ignore[union-attr]
            h._count_error("shape_of", e)
            return None

    def capture_operation(self, h: PolicyHost) -> str | None:
        """The operation a captured forward runs in; None when it cannot be told (never raises)."""
        try:
            return h.current_operation()
        except Exception as e:
            h._count_error("capture_operation", e)
            return None

    # ---- in flight (the black box) -----------------------------------------------------------
    def flight_begin(self, h: PolicyHost, tls: ForwardRecord, path: str, args: Any, kwargs: Any) -> None:
        """Tell the flight listeners of every forward, attributed or not, with its shape where the
        memory model reads one (the attributed forward's state names the deepest layer entered)."""
        st = tls.state
        shape = tls.shape if st is not None else (
            self.shape(h, args, kwargs) if not path and self.capacity is not None else None)
        tls.features = shape
        tls.flight = self._opened(h, path, shape, st if st is not None and not st.root_only else None)

    def flight_end(self, h: PolicyHost, tls: ForwardRecord) -> None:
        """Tell the flight listeners this thread's forward ended (nothing when none heard it open)."""
        if tls.flight is not None:
            tokens, tls.flight = tls.flight, None
            self._closed(h, tokens)

    def _opened(self, h: PolicyHost, root: str, features: Features | None, state: Any) -> tuple[int, ...]:
        """Each listener's token for a forward that opened (one that raises is counted and skipped)."""
        tokens = []
        for fl in self.flight:
            try:
                tokens.append(fl.opened(h.name, root, features, state))
            except Exception as e:
                tokens.append(-1)
                h._count_error("flight", e)
        return tuple(tokens)

    def _closed(self, h: PolicyHost, tokens: tuple[int, ...]) -> None:
        if not tokens:
            return
        for fl, token in zip(self.flight, tokens):
            try:
                fl.closed(token)
            except Exception as e:
                h._count_error("flight", e)

    # ---- a forward's end ---------------------------------------------------------------------
    def end(self, h: PolicyHost, tls: ForwardRecord, state: ForwardState | None, t: float, self_time_s: float,
            root: LayerCall | None, raised: bool, exc: BaseException | None) -> None:
        """The close bookkeeping after the adapter folded the forward's figures: a captured forward
        counts in its capture, and the forward is charged to the scheduler and told to the observers
        (``t``: when the adapter's close began; ``self_time_s``: our time in the forward before it).
        A root reading (memory model only) is no attributed forward to either. A forward a capture
        or a measuring window asked for (``tls.on_demand``) is counted in the overhead, not in the
        sampling's budget (which would then attribute nothing for hours)."""
        cap, tls.capture = tls.capture, None
        if cap is not None:
            self._captured_forward_ended(h, cap, _perf_counter(), root)
        end = _perf_counter()
        attributed = state is not None and not state.root_only
        self.scheduler.record(end - tls.start_s, attributed, self_time_s + end - t, tls.on_demand)
        done = state if attributed else None
        h._notify(lambda obs: obs.forward_done(h, done, raised, exc))

    def _captured_forward_ended(self, h: PolicyHost, cap: Capture, end: float, root: LayerCall | None) -> None:
        """One forward of ``cap`` ended: count it in; once the capture has its forwards, free the
        slot for the next capture and tell the observers (the OTel recorder emits its spans)."""
        cap.forward_finished(end, root)
        if not cap.done:
            return
        with live.LOCK:
            if self.running_capture is cap:
                self.running_capture = None
        if not cap.cancelled:
            h._notify(lambda obs: obs.capture_done(h, cap))  # never raises: errors are counted


__all__ = ["ForwardPolicy", "ForwardRecord", "PolicyHost"]
