"""The handle ``instrument()`` returns, whatever the model's framework.

Everything a handle does that does not touch the framework is here: the per-layer statistics and
their exported windows, the forward scheduler's budget, deep captures, the memory model, summaries
and exports, observers, pause/resume/uninstrument. A framework adapter (``attribution/torch/``)
subclasses it with what does: attaching hooks to the model, the per-thread forward machine, the
layer paths of its tree. This module imports no framework.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Callable

from .._log import rate_limited
from ..baselines import Baseline
from ..baselines import save as save_baseline
from ..baselines.from_layers import build as build_baseline
from ..capacity.model import Prediction
from ..capacity.service import Capacity
from ..capacity.shapes import Features, ShapeOf
from ..config import Config
from ..dumps.capture import Capture
from ..errors import CaptureBusy, InstrumentationError, MemprofError
from ..reports.summary import format_summary, summary_dict
from ..reports.timeline_export import write_timeline
from ..sources.survivors import SurvivorTable
from ..timeline import OperationRecord, Sample
from . import registry as live
from .forward_state import ForwardState, event_capacity, event_dict
from . import layer_structure
from .handle import FlightListener, ForwardObserver, ProcessHistory
from .measure_window import MeasureWindow
from .peaks import LayerCall
from .scheduler import AttributionScheduler
from .stats import LayerAccumulator, LayerMemoryStats
from .windows import WindowFigures, WindowedPeaks


_DROP_WHY = {
    "concurrent": "another forward ran on the process meanwhile, and the allocator statistics read at "
                  "layer boundaries (CUDA's, TensorFlow's) are the device's, shared by every thread",
    "trace_lost": "the CUDA allocator trace could not give the forward's events",
}


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


def _no_history() -> tuple[list[Sample], list[OperationRecord]]:
    return [], []


def _no_operation() -> str | None:
    return None


class Instrumentation:
    """The handle ``instrument()`` returns (a ``ModelHandle``). ``uninstrument()`` is idempotent;
    the handle is also a context manager that uninstruments on exit."""

    # Can a capture see each op's allocations (a dispatch to hook, as torch's)? Else its profile
    # weighs the innermost layer calls by their peak increase (``dumps/capture.py``).
    captures_ops = True

    def __init__(self, name: str, config: Config, shape_of: ShapeOf | None = None) -> None:
        self.name = name
        self.config = config
        acfg = config.attribution
        ccfg = config.capacity
        self.scheduler = AttributionScheduler(acfg.every_n_forwards, acfg.overhead_budget, acfg.enabled,
                                              ccfg.learning_budget if ccfg.enabled else 0.0)
        self._stats = LayerAccumulator()
        # storages born in attributed forwards and still alive, per birth layer (leak detection)
        self.survivors: SurvivorTable | None = (SurvivorTable(config.leaks.max_tracked_storages)
                                                if config.leaks.surviving else None)
        self._windows = WindowedPeaks(acfg.window, time.perf_counter())
        # compact tuples (see forward_state), bounded by count and by bytes, whichever is smaller
        self._events: deque[tuple] = deque(maxlen=event_capacity(acfg.max_events, acfg.max_event_bytes))
        self._events_lock = threading.Lock()
        self.events_dropped = 0
        self.hook_errors = 0
        self.forward_errors = 0
        self.interrupted_forwards = 0  # forwards a BaseException abandoned (also in forward_errors)
        # attributed forwards whose per-layer figures were dropped rather than published wrong,
        # by reason: "concurrent" (allocator read at boundaries while another forward ran),
        # "trace_lost" (the allocator trace could not give the forward's events)
        self.unattributed: dict[str, int] = {}
        self.last_device = "cpu"
        self._origin_s = time.perf_counter()
        self._created_unix = time.time()
        self._closed = False
        # forward observers (handle.py): how the layers above hear of forwards and completed
        # captures (the OOM flight recorder, the OTel recorder); the composition root adds them
        self._observers: list[ForwardObserver] = []
        # forwards in flight, attributed or not (the black box); empty: the forward path skips it
        self._flight: list[FlightListener] = []
        # the process's samples and operations, for export_timeline (set by the composition root)
        self.process_history: ProcessHistory = _no_history
        # the name of the operation the calling context runs in (set by the composition root, which
        # owns operations): what a capture labels its forwards with
        self.current_operation: Callable[[], str | None] = _no_operation
        self._capture: Capture | None = None
        self.last_capture: Capture | None = None
        self._window: MeasureWindow | None = None  # a measuring window for a live baseline, while open
        # the memory model: each measured forward's shape and root peak (docs/capacity.md)
        self.capacity: Capacity | None = (Capacity(config.capacity, shape_of)
                                          if config.capacity.enabled else None)

    # ---- what the framework adapter provides ---------------------------------------------------
    @property
    def model(self) -> Any:
        """The instrumented model (None once it was garbage-collected)."""
        raise NotImplementedError

    @property
    def paused(self) -> bool:
        raise NotImplementedError

    @property
    def layer_count(self) -> int:
        """Layer paths tracked (after max_depth, include/exclude and the max_layers fold)."""
        raise NotImplementedError

    def object_paths(self) -> dict[int, str]:
        """``id(layer object) -> layer path`` for every layer of the model, tracked or not."""
        raise NotImplementedError

    def held_tensors(self) -> dict[str, dict[tuple[str, int], int]]:
        """What the model holds, by kind: ``weights`` (its parameters and buffers) and ``kv_cache``
        (the tensors of the KV cache its last forward was called with, while that cache lives), each
        ``(device, storage key) -> bytes`` with a shared storage once. Empty where the adapter cannot
        tell (the memory breakdown then says the model's weights are not counted)."""
        return {}

    def layer_objects(self) -> list[tuple[str, Any]]:
        """``(path, layer object)`` for every layer of the model, in its order (empty once the model
        was garbage-collected)."""
        raise NotImplementedError

    def _detach(self) -> None:
        """Take every hook off the model."""
        raise NotImplementedError

    def _reattach(self) -> None:
        """Put the hooks back after ``pause()``."""
        raise NotImplementedError

    def _release_open_forwards(self) -> None:
        """End the attributed forwards still open in other threads (uninstrument's cleanup)."""

    # ---- lifecycle ---------------------------------------------------------------------------
    def pause(self) -> None:
        """Remove the root hooks (the model runs exactly as plain); stats and config are kept."""
        self._detach()

    def resume(self) -> None:
        """Re-attach after ``pause()``; a no-op when running or uninstrumented."""
        if not self._closed and self.paused:
            self._reattach()

    def uninstrument(self) -> None:
        """Remove every hook; the model is as before; figures stay readable. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._detach()
        cap = self._capture
        if cap is not None and not cap.done:  # it would wait for ever: its forwards can no longer come
            cap.cancel("the model was uninstrumented before its forwards were captured")
        win = self._window
        if win is not None:  # no more forwards will come: its waiter answers with what it kept
            win.close()
        self._release_open_forwards()
        self._notify(lambda obs: obs.uninstrumented(self))
        live.unregister(self)
        if self.survivors is not None:
            self.survivors.clear()  # drop the held weakrefs: nothing reads this table any more

    def __enter__(self) -> "Instrumentation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstrument()


    # ---- figures ---------------------------------------------------------------------------
    @property
    def attribution_method(self) -> str:
        """What the per-layer figures are read from (the summary's ``method``)."""
        return "cuda caching allocator" if self.last_device.startswith("cuda") else "tensor ledger"

    @property
    def overhead_seconds(self) -> float:
        """Time our instrumentation added to forwards (self-timed hooks + measured slowdown)."""
        return self.scheduler.state().attribution_seconds

    @property
    def attributed_forwards(self) -> int:
        """Forwards attributed per layer so far (the scheduler's count)."""
        return self.scheduler.state().attributed

    def layer_stats(self) -> dict[str, LayerMemoryStats]:
        stats = self._stats.snapshot()
        surviving = self.surviving_by_layer()
        return {k: dataclasses.replace(v, surviving_bytes=surviving[k]) if k in surviving else v
                for k, v in stats.items()}

    def surviving(self) -> dict[tuple[str, str], int]:
        """(layer, device) -> bytes of storages born there during attributed forwards that are
        still alive now (empty with ``leaks.surviving`` off). Attributed forwards only: with a
        sampling scheduler, a sample of what all forwards leave behind (docs/reference.md)."""
        if self.survivors is None:
            return {}
        return {k: b for k, (b, _n) in self.survivors.surviving().items()}

    def surviving_by_layer(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (layer, _device), b in self.surviving().items():
            out[layer] = out.get(layer, 0) + b
        return out

    def peak_memory_per_layer(self) -> dict[str, int]:
        """Path -> ``peak_allocated``: the absolute level the allocator (on CPU, the tensor ledger) was
        at when the layer peaked, weights and all else held included. The layer's own need, what
        the per-layer series and baselines show, is ``layer_stats()[path].peak_increase``."""
        return {k: v.peak_allocated for k, v in self._stats.snapshot().items()}

    def layer_forward_totals(self) -> dict[str, tuple[float, int]]:
        """Path -> (seconds in attributed calls, calls): the forward-time summary's figures."""
        return self._stats.forward_totals()

    def exported_layer_peaks(self, now: float | None = None) -> dict[str, WindowFigures]:
        """Per-layer figures over the last completed ``attribution.window`` (what exporters publish)."""
        return self._windows.exported(time.perf_counter() if now is None else now)

    def fragmentation_stats(self) -> dict[str, float]:
        """Per-layer mean allocator fragmentation, for layers where it was measured (CUDA).

        CPU attribution counts tensor storages, which have no heap layout: CPU layers are absent
        here (the process-wide host heap figure is ``memprof_allocator_fragmentation_ratio``).
        """
        return {k: v.avg_fragmentation for k, v in self._stats.snapshot().items()
                if v.avg_fragmentation is not None}

    # ---- baselines (docs/reference.md, "Baselines") ----------------------------------------
    def layer_signatures(self) -> dict[str, str]:
        """Path -> structural signature (type, own parameter shapes) of every layer, model order."""
        return layer_structure.signatures(self.layer_objects())

    def environment(self) -> dict[str, str | None]:
        """What the figures depend on besides the model: device, framework (and CUDA) versions, the
        attention kernel of a transformers model, Python's and memprof-otel's versions."""
        return layer_structure.environment(self.model, self.last_device)

    def baseline(self, *args: Any, inputs: Mapping[str, str] | None = None, path: str | None = None,
                 **kwargs: Any) -> Baseline:
        """Run one forward, ``model(*args, **kwargs)``, attributed whatever the scheduler's budget, on
        fresh figures (the handle's figures so far are forgotten), and return its per-layer baseline
        (written to ``path`` too when given). ``inputs`` names the inputs in the file; by default each
        argument's dtype and shape (``arg0: float32[4,16]``). Run it under ``torch.inference_mode()``
        for an inference baseline: with autograd on, layers retain what backward needs."""
        model = self.model
        if model is None or self._closed:
            raise InstrumentationError(f"{self.name!r} is uninstrumented or its model is gone: no baseline")
        described = dict(inputs) if inputs is not None else {
            **{f"arg{i}": layer_structure.describe_input(a) for i, a in enumerate(args)},
            **{k: layer_structure.describe_input(v) for k, v in kwargs.items()}}
        self.reset_stats()
        sched = self.scheduler
        saved = (sched.every_n, sched.budget, sched.enabled)
        before = sched.state().attributed
        # one forward attributed for sure: every forward may be, at no budget (then as configured)
        sched.every_n, sched.budget, sched.enabled = 1, 1.0, True
        try:
            model(*args, **kwargs)
        finally:
            sched.every_n, sched.budget, sched.enabled = saved
        stats = self.layer_stats()
        if sched.state().attributed == before or not stats:
            raise MemprofError(f"{self.name!r}: the forward was not attributed (paused, running inside "
                               "another instrumented forward, or its figures dropped as concurrent): no baseline")
        result = build_baseline(self.name, {p: s.to_dict() for p, s in stats.items()}, self.layer_signatures(),
                                inputs=described, environment=self.environment(), source="python", forwards=1)
        if path is not None:
            save_baseline(result, path)
        return result

    # ---- capacity ---------------------------------------------------------------------------
    def _capacity_on(self) -> Capacity:
        if self.capacity is None:
            raise MemprofError(f"{self.name!r}: the memory model is off (capacity.enabled: false)")
        return self.capacity

    def predict_peak(self, **features: int) -> Prediction:
        """The predicted peak increase of one forward of this shape (e.g. ``batch=8, seq_len=512``),
        with the error it carries (measured on shapes the fit was not given, grown with how far
        outside the shapes seen this one lies: ``extrapolation_factor``). ``peak_increase_bytes`` is
        None, with ``reason``, when the model cannot answer yet; past ``capacity.max_extrapolation``
        ``upper_bytes`` is None and ``reason`` says it is not known (``estimate_bytes`` keeps the
        fit's figure); a feature name the model never saw,
        or one it needs and was not given, raises ``ShapeError`` naming it."""
        return self._capacity_on().predict(features, self.last_device)

    def fits(self, *, unknown: bool = True, **features: int) -> bool:
        """Would one forward of this shape fit in the memory its device has available now, with
        the margin and the fit's error taken off? ``unknown`` is the answer only when the model or
        the limit cannot tell (too few shapes seen, no limit known, or a shape more than
        ``capacity.max_extrapolation`` times outside those seen whose estimate alone would fit):
        letting traffic through by default; a gate that must never risk an OOM passes False. A
        shape whose estimate alone is over what is available is False whatever ``unknown`` says. A
        misspelt or missing feature raises ``ShapeError``: a gate never opens on a typo."""
        return self._capacity_on().fits(self.last_device, features, unknown)

    def headroom(self, **features: int) -> dict[str, Any]:
        """This model's document of ``GET /v1/headroom`` (the value under its name in ``models``),
        the same fields: with features, the prediction and whether it fits; without, the largest
        safe batch per sequence length. ``ShapeError`` as ``predict_peak``."""
        return self._capacity_on().answer(self.last_device, features or None)

    def status(self) -> dict[str, Any]:
        """Its line in ``GET /v1/status`` (the ``ModelHandle`` contract)."""
        st = self.scheduler.state()
        return {"name": self.name, "device": self.last_device, "layers": self.layer_count,
                "paused": self.paused, "forwards": st.forwards, "attributed_forwards": st.attributed,
                "overhead_seconds": st.attribution_seconds, "hook_errors": self.hook_errors,
                "forward_errors": self.forward_errors, "figures": self.figures_note()}

    def figures_note(self) -> str:
        """What the per-layer figures are read from, or why there are none (``/v1/status``)."""
        return self.attribution_method

    def forward_features(self) -> Features | None:
        """The shape of the forward this thread runs or is closing, where it was read at its opening
        (for the memory model or the black box; None otherwise): the OOM recorder, an observer
        called as the forward closes, cites it in the OOM's cause."""
        tls = getattr(self, "_tls", None)
        return getattr(tls, "features", None)

    def add_observer(self, observer: ForwardObserver) -> None:
        """Hear of this handle's forwards and captures (``handle.ForwardObserver``); the composition root
        adds the OOM recorder and the OTel recorder."""
        self._observers.append(observer)

    def add_flight_listener(self, listener: FlightListener) -> None:
        """Hear of every forward's opening and end (``handle.FlightListener``); the composition
        root adds the black box. Adding the same listener again does nothing."""
        if listener not in self._flight:
            self._flight.append(listener)

    def _flight_opened(self, root: str, features: Features | None, state: Any) -> tuple[int, ...] | None:
        """Tell the flight listeners a forward opened (one that raises is counted and skipped)."""
        tokens = []
        for fl in self._flight:
            try:
                tokens.append(fl.opened(self.name, root, features, state))
            except Exception as e:
                tokens.append(-1)
                self._count_error("flight", e)
        return tuple(tokens)

    def _flight_begin(self, tls: ForwardRecord, path: str, args: Any, kwargs: Any) -> None:
        """The black box: every forward, attributed or not, while in flight, with its shape where the
        memory model reads one (the attributed forward's state names the deepest layer entered)."""
        st = tls.state
        shape = tls.shape if st is not None else (
            self._shape(args, kwargs) if not path and self.capacity is not None else None)
        tls.features = shape
        tls.flight = self._flight_opened(path, shape, st if st is not None and not st.root_only else None)

    def _flight_end(self, tls: ForwardRecord) -> None:
        if tls.flight is not None:
            tokens, tls.flight = tls.flight, None
            self._flight_closed(tokens)

    def _flight_closed(self, tokens: tuple[int, ...] | None) -> None:
        if not tokens:
            return
        for fl, token in zip(self._flight, tokens):
            try:
                fl.closed(token)
            except Exception as e:
                self._count_error("flight", e)

    def events(self) -> list[dict[str, Any]]:
        with self._events_lock:
            kept = list(self._events)
        return [event_dict(e) for e in kept]

    def summary_dict(self) -> dict[str, Any]:
        return summary_dict(self)

    def summary(self) -> str:
        return format_summary(self)

    def print_summary(self) -> None:
        print(self.summary())

    def export_timeline(self, path: str) -> None:
        write_timeline(self, path)

    def capture(self, forwards: int = 1) -> Capture:
        """Deep-capture the next ``forwards`` forwards (returns at once; see ``Capture.wait``)."""
        if self._closed:
            raise InstrumentationError(f"{self.name!r} is uninstrumented; instrument it again to capture")
        cap = Capture(self.name, forwards, per_op=self.captures_ops, device=self.last_device)
        with live.LOCK:
            current = self._capture
            if current is not None and not current.done:
                raise CaptureBusy(f"a capture of {self.name!r} is running "
                                  f"({current.completed}/{current.forwards} forwards)")
            self._capture = cap
            self.last_capture = cap
        return cap

    def measure_window(self, forwards: int) -> MeasureWindow:
        """Open a measuring window (``measure_window.py``): every model forward is attributed, and kept
        per shape, until ``forwards`` were kept or ``end_window`` closes it. One at a time."""
        if self._closed:
            raise InstrumentationError(f"{self.name!r} is uninstrumented; instrument it again to measure it")
        win = MeasureWindow(self.name, forwards)
        with live.LOCK:
            current = self._window
            if current is not None and current.open:
                raise CaptureBusy(f"a measuring window of {self.name!r} is open ({current.kept}/{current.forwards} "
                                  "forwards)")
            self._window = win
        return win

    def end_window(self, win: MeasureWindow) -> None:
        """Close ``win``: the forwards after it are attributed as the scheduler says again."""
        win.close()
        with live.LOCK:
            if self._window is win:
                self._window = None

    def export_speedscope(self, path: str) -> None:
        """Write the last capture as a speedscope file."""
        if self.last_capture is None or self.last_capture.completed == 0:
            raise MemprofError("no completed capture yet: call capture(forwards=N) and run a forward")
        self.last_capture.save(path)

    def _capture_operation(self) -> str | None:
        """The operation a captured forward runs in; None when it cannot be told (never raises)."""
        try:
            return self.current_operation()
        except Exception as e:
            self._count_error("capture_operation", e)
            return None

    def _captured_forward_ended(self, cap: Capture, end: float, root: LayerCall | None) -> None:
        """One forward of ``cap`` ended: count it in; once the capture has its forwards, free the
        handle for the next capture and tell the observers (the OTel recorder emits its spans)."""
        cap.forward_finished(end, root)
        if not cap.done:
            return
        with live.LOCK:
            if self._capture is cap:
                self._capture = None
        if not cap.cancelled:
            self._notify(lambda obs: obs.capture_done(self, cap))  # never raises: errors are counted

    def reset_stats(self) -> None:
        """Forget the per-layer figures and events. Surviving bytes stay: they are a level of
        memory alive now, not a history."""
        self._stats.clear()
        self._windows.clear()
        with self._events_lock:
            self._events.clear()

    # ---- for the adapter ---------------------------------------------------------------------
    def _choose_measurement(self, tls: ForwardRecord, opener: Any, path: str, t: float, args: Any,
                            kwargs: dict[str, Any] | None, compiled: bool = False) -> None:
        """The per-forward policy, the same on every framework: a waiting capture claims the forward,
        else the scheduler may pick it for attribution (``_begin_attributed``, which leaves
        ``tls.state`` set when it measures); a model forward left plain is read at its root only for
        the memory model (``_begin_root_reading``, ``capacity.root_readings``); a model forward of a
        shape the memory model has not measured may be attributed beyond the budget
        (``capacity.learning_budget``, ``AttributionScheduler.may_learn``); a measured model
        forward's shape is read for the memory model (a layer's own shapes are not the model's).
        ``opener``: what the adapter knows the opening call by (torch's module, Keras' layer id)."""
        cap = self._capture
        win = self._window
        tls.shape = None
        tls.on_demand = False
        shape_read = False
        if cap is not None and cap.claim():
            tls.on_demand = True
            self._begin_attributed(opener, path, t, cap, compiled)
        elif win is not None and not path and win.open:  # a measuring window takes every model forward
            tls.on_demand = True
            self._begin_attributed(opener, path, t, None, compiled)
        elif self.scheduler.should_attribute():
            self._begin_attributed(opener, path, t, None, compiled)
        elif not path and self.capacity is not None and self.scheduler.may_learn():
            # a shape the memory model has not measured is worth an attributed forward
            # (scheduler.may_learn): the shape is read now, once, for the decision and the model
            tls.shape, shape_read = self._shape(args, kwargs), True
            kind = self.capacity.new_kind(tls.shape) if tls.shape else None
            if kind is None:
                self.scheduler.known()
            elif self.scheduler.claim(kind):
                self._begin_attributed(opener, path, t, None, compiled)
        if tls.state is None and not path and self.capacity is not None and self.config.capacity.root_readings:
            self._begin_root_reading(opener, t)
        if tls.state is not None and not path and self.capacity is not None and not shape_read:
            tls.shape = self._shape(args, kwargs)
        tls.features = tls.shape

    def _begin_attributed(self, opener: Any, path: str, t: float, cap: Capture | None, compiled: bool) -> None:
        """Start measuring this thread's forward per layer (``cap``: the capture that claimed it)."""
        raise NotImplementedError

    def _begin_root_reading(self, opener: Any, t: float) -> None:
        """Start reading a model forward the scheduler left plain at its root only."""
        raise NotImplementedError

    def _end_forward(self, tls: ForwardRecord, state: ForwardState | None, t: float, self_time_s: float,
                     root: LayerCall | None, raised: bool, exc: BaseException | None) -> None:
        """The close bookkeeping after the adapter folded the forward's figures: a captured forward
        counts in its capture, and the forward is charged to the scheduler and told to the observers
        (``t``: when the adapter's close began; ``self_time_s``: our time in the forward before it)."""
        cap, tls.capture = tls.capture, None
        if cap is not None:
            self._captured_forward_ended(cap, _perf_counter(), root)
        end = _perf_counter()
        self._forward_ended(state, end - tls.start_s, self_time_s + end - t, raised, exc, tls.on_demand)

    def _publish(self, state: ForwardState, calls: list[LayerCall], t: float, raised: bool,
                 shape: Features | None, dropped: str | None) -> None:
        """Fold one finished forward into the figures: its calls into the statistics and windows,
        its root peak into the memory model (with its ``shape``), its events into the timeline.
        ``dropped``: why its figures must not be published (another forward moved a shared
        counter, a lost trace), counted instead. A root-only reading feeds the memory model alone."""
        if state.root_only:  # only the memory model hears of it; a figure another forward moved is dropped
            if dropped is None and shape and not raised and self.capacity is not None and calls:
                root = calls[-1]
                self.capacity.observe(shape, root[2] - root[1], root[3] - root[1], state.kernel)
                self.capacity.root_readings += 1
            elif self.capacity is not None and dropped is not None:
                self.capacity.root_readings_dropped += 1
            return
        if dropped is not None:
            # never a silently wrong figure: the forward counts, its per-layer figures do not
            self.unattributed[dropped] = self.unattributed.get(dropped, 0) + 1
            win = self._window
            if win is not None and not state.root_path:
                win.dropped += 1  # the window says so, rather than wait for forwards that ran
            rate_limited.warning(f"unattributed:{dropped}", "memprof_otel: %s: an attributed forward's "
                                 "per-layer figures were dropped (%s); counted in "
                                 "memprof_forwards_unattributed_total", self.name, _DROP_WHY[dropped])
            return
        self._stats.merge(calls, baseline=state.baseline)
        self._windows.merge(calls, state.baseline, t)
        win = self._window
        if win is not None and not state.root_path:  # a model forward (not a submodule's) in a measuring window
            win.add(shape, calls, raised)
        if shape and not raised and self.capacity is not None:
            root = next((c for c in reversed(calls) if c[0] == state.root_path), None)
            if root is not None:  # the opener's own call: the forward's peak above its entry level
                # (and, read apart, the same forward in the units its limit counts)
                self.capacity.observe(shape, root[2] - root[1], root[3] - root[1], state.kernel)
        if state.events:
            with self._events_lock:
                overflow = len(self._events) + len(state.events) - (self._events.maxlen or 0)
                if overflow > 0:
                    self.events_dropped += overflow
                self._events.extend(state.events)

    def _shape(self, args: Any, kwargs: dict[str, Any] | None) -> Features | None:
        """The forward's shape features for the memory model (``capacity`` on), None when a user's
        ``shape_of`` raised: counted, the forward unmodelled."""
        try:
            return self.capacity.features(tuple(args), kwargs or {})  # type: ignore[union-attr]
        except Exception as e:
            self.capacity.shape_errors += 1  # type: ignore[union-attr]
            self._count_error("shape_of", e)
            return None

    def _forward_ended(self, state: ForwardState | None, duration_s: float, self_time_s: float,
                       raised: bool, exc: BaseException | None, on_demand: bool = False) -> None:
        """Charge a finished forward to the scheduler and tell the observers; ``state`` None when it
        was not measured. A root reading (memory model only) is no attributed forward to either.
        ``on_demand``: a capture or a measuring window asked for it; its cost is counted in the
        overhead, not in the sampling's budget (which would then attribute nothing for hours)."""
        attributed = state is not None and not state.root_only
        self.scheduler.record(duration_s, attributed, self_time_s, on_demand)
        done = state if attributed else None
        self._notify(lambda obs: obs.forward_done(self, done, raised, exc))

    def _notify(self, event: Callable[[ForwardObserver], object]) -> None:
        """Tell every observer of ``event``: one that raises is counted (``hook_errors``) and
        skipped, never stopping the observers after it or the forward's attribution."""
        for obs in self._observers:
            try:
                event(obs)
            except Exception as e:
                self._count_error("observer", e)

    def _count_error(self, where: str, e: BaseException) -> None:
        self.hook_errors += 1
        rate_limited.warning(f"hook:{where}", "memprof_otel: %s failed in %s hook: %r (counted; the "
                             "model is unaffected)", self.name, where, e)


__all__ = ["ForwardRecord", "Instrumentation"]
