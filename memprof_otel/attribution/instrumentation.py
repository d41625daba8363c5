"""The handle ``instrument()`` returns, whatever the model's framework: its public face.

Everything a handle does that does not touch the framework is here: the per-layer statistics and
their exported windows, deep captures and measuring windows, baselines, the memory model, summaries
and exports, observers, pause/resume/uninstrument. Which forward is measured, and what its end is
charged to, is the handle's ``ForwardPolicy`` (``forward_policy.py``). A framework adapter
(``attribution/torch/``, ``attribution/keras/``) subclasses it with what touches the framework: the
duties ``FrameworkAdapter`` (``adapter.py``) declares, and the per-thread forward machine that calls
the policy. This module imports no framework.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Callable, final

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
from . import live_handles as live
from .adapter import FrameworkAdapter
from .forward_policy import ForwardPolicy
from .forward_state import ForwardState, event_capacity, event_dict
from . import layer_structure
from .handle import FlightListener, ForwardObserver, ProcessHistory
from .measure_window import MeasureWindow
from .peaks import LayerCall
from .stats import LayerAccumulator, LayerMemoryStats
from .windows import WindowFigures, WindowedPeaks


_DROP_WHY = {
    "concurrent": "another forward ran on the process meanwhile, and the allocator statistics read at "
                  "layer boundaries (CUDA's, TensorFlow's) are the device's, shared by every thread",
    "trace_lost": "the CUDA allocator trace could not give the forward's events",
}


def _no_history() -> tuple[list[Sample], list[OperationRecord]]:
    return [], []


def _no_operation() -> str | None:
    return None


def _capacity_of(h: "Instrumentation") -> Capacity:
    """The handle's memory model, for the methods that answer from it; raises when it is off."""
    if h.capacity is None:
        raise MemprofError(f"{h.name!r}: the memory model is off (capacity.enabled: false)")
    return h.capacity


class Instrumentation(FrameworkAdapter):
    """The handle ``instrument()`` returns (a ``ModelHandle``). ``uninstrument()`` is idempotent;
    the handle is also a context manager that uninstruments on exit. Abstract: an adapter fills in
    ``FrameworkAdapter``'s duties."""

    def __init__(self, name: str, config: Config, shape_of: ShapeOf | None = None) -> None:
        self.name = name
        self.config = config
        acfg = config.attribution
        # the memory model: each measured forward's shape and root peak (docs/capacity.md)
        self.capacity: Capacity | None = (Capacity(config.capacity, shape_of)
                                          if config.capacity.enabled else None)
        # which forward is measured, charged to which budget, told to which flight listener
        self._policy = ForwardPolicy(config, self.capacity)
        self.scheduler = self._policy.scheduler  # its budget and counts, read by status and tests
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
        # the process's samples and operations, for export_timeline (set by the composition root)
        self.process_history: ProcessHistory = _no_history
        # the name of the operation the calling context runs in (set by the composition root, which
        # owns operations): what a capture labels its forwards with
        self.current_operation: Callable[[], str | None] = _no_operation
        self.last_capture: Capture | None = None

    # ---- lifecycle ---------------------------------------------------------------------------
    @final
    def pause(self) -> None:
        """Remove the root hooks (the model runs exactly as plain); stats and config are kept."""
        self._detach()

    @final
    def resume(self) -> None:
        """Re-attach after ``pause()``; a no-op when running or uninstrumented."""
        if not self._closed and self.paused:
            self._reattach()

    @final
    def uninstrument(self) -> None:
        """Remove every hook; the model is as before; figures stay readable. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._detach()
        cap = self._policy.running_capture
        if cap is not None and not cap.done:  # it would wait for ever: its forwards can no longer come
            cap.cancel("the model was uninstrumented before its forwards were captured")
        win = self._policy.open_window
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
    def predict_peak(self, **features: int) -> Prediction:
        """The predicted peak increase of one forward of this shape (e.g. ``batch=8, seq_len=512``),
        with the error it carries (measured on shapes the fit was not given, grown with how far
        outside the shapes seen this one lies: ``extrapolation_factor``). ``peak_increase_bytes`` is
        None, with ``reason``, when the model cannot answer yet; past ``capacity.max_extrapolation``
        ``upper_bytes`` is None and ``reason`` says it is not known (``estimate_bytes`` keeps the
        fit's figure); a feature name the model never saw,
        or one it needs and was not given, raises ``ShapeError`` naming it."""
        return _capacity_of(self).predict(features, self.last_device)

    def fits(self, *, unknown: bool = True, **features: int) -> bool:
        """Would one forward of this shape fit in the memory its device has available now, with
        the margin and the fit's error taken off? ``unknown`` is the answer only when the model or
        the limit cannot tell (too few shapes seen, no limit known, or a shape more than
        ``capacity.max_extrapolation`` times outside those seen whose estimate alone would fit):
        letting traffic through by default; a gate that must never risk an OOM passes False. A
        shape whose estimate alone is over what is available is False whatever ``unknown`` says. A
        misspelt or missing feature raises ``ShapeError``: a gate never opens on a typo."""
        return _capacity_of(self).fits(self.last_device, features, unknown)

    def headroom(self, **features: int) -> dict[str, Any]:
        """This model's document of ``GET /v1/headroom`` (the value under its name in ``models``),
        the same fields: with features, the prediction and whether it fits; without, the largest
        safe batch per sequence length. ``ShapeError`` as ``predict_peak``."""
        return _capacity_of(self).answer(self.last_device, features or None)

    def status(self) -> dict[str, Any]:
        """Its line in ``GET /v1/status`` (the ``ModelHandle`` contract)."""
        st = self.scheduler.state()
        return {"name": self.name, "device": self.last_device, "layers": self.layer_count,
                "paused": self.paused, "forwards": st.forwards, "attributed_forwards": st.attributed,
                "overhead_seconds": st.attribution_seconds, "hook_errors": self.hook_errors,
                "forward_errors": self.forward_errors, "figures": self.figures_note()}

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
        flight = self._policy.flight
        if listener not in flight:
            flight.append(listener)

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
            current = self._policy.running_capture
            if current is not None and not current.done:
                raise CaptureBusy(f"a capture of {self.name!r} is running "
                                  f"({current.completed}/{current.forwards} forwards)")
            self._policy.running_capture = cap
            self.last_capture = cap
        return cap

    def measure_window(self, forwards: int) -> MeasureWindow:
        """Open a measuring window (``measure_window.py``): every model forward is attributed, and kept
        per shape, until ``forwards`` were kept or ``end_window`` closes it. One at a time."""
        if self._closed:
            raise InstrumentationError(f"{self.name!r} is uninstrumented; instrument it again to measure it")
        win = MeasureWindow(self.name, forwards)
        with live.LOCK:
            current = self._policy.open_window
            if current is not None and current.open:
                raise CaptureBusy(f"a measuring window of {self.name!r} is open ({current.kept}/{current.forwards} "
                                  "forwards)")
            self._policy.open_window = win
        return win

    def end_window(self, win: MeasureWindow) -> None:
        """Close ``win``: the forwards after it are attributed as the scheduler says again."""
        win.close()
        with live.LOCK:
            if self._policy.open_window is win:
                self._policy.open_window = None

    def export_speedscope(self, path: str) -> None:
        """Write the last capture as a speedscope file."""
        if self.last_capture is None or self.last_capture.completed == 0:
            raise MemprofError("no completed capture yet: call capture(forwards=N) and run a forward")
        self.last_capture.save(path)

    def reset_stats(self) -> None:
        """Forget the per-layer figures and events. Surviving bytes stay: they are a level of
        memory alive now, not a history. A forward an interrupt abandoned before the reset is
        closed first, so that it is forgotten with the rest."""
        self._close_abandoned()
        self._stats.clear()
        self._windows.clear()
        with self._events_lock:
            self._events.clear()

    # ---- for the adapter and the forward policy ------------------------------------------------
    @final
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
            win = self._policy.open_window
            if win is not None and not state.root_path:
                win.dropped += 1  # the window says so, rather than wait for forwards that ran
            rate_limited.warning(f"unattributed:{dropped}", "memprof_otel: %s: an attributed forward's "
                                 "per-layer figures were dropped (%s); counted in "
                                 "memprof_forwards_unattributed_total", self.name, _DROP_WHY[dropped])
            return
        self._stats.merge(calls, baseline=state.baseline)
        self._windows.merge(calls, state.baseline, t)
        win = self._policy.open_window
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

    @final
    def _notify(self, event: Callable[[ForwardObserver], object]) -> None:
        """Tell every observer of ``event``: one that raises is counted (``hook_errors``) and
        skipped, never stopping the observers after it or the forward's attribution."""
        for obs in self._observers:
            try:
                event(obs)
            except Exception as e:
                self._count_error("observer", e)

    @final
    def _count_error(self, where: str, e: BaseException) -> None:
        self.hook_errors += 1
        rate_limited.warning(f"hook:{where}", "memprof_otel: %s failed in %s hook: %r (counted; the "
                             "model is unaffected)", self.name, where, e)


__all__ = ["Instrumentation"]
