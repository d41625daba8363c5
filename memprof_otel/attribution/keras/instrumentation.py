"""``instrument(model)`` for a Keras 3 model on a backend whose models are no ``torch.nn.Module``
(TensorFlow, JAX): what is the same on each; a ``KerasBackend`` (``backend.py``) gives the rest.

Keras has no hook API, but every layer call looks its ``call`` up on the instance
(``Operation.__call__``), so each tracked layer gets an instance attribute ``call`` that wraps the
class's: the root's opens a forward when the scheduler picks one, the others feed its
``ForwardState`` enter/exit. ``del layer.call`` undoes it (Keras' own calibration passes shadow
``call`` the same way). The counter is the backend's, for the model's device (TF's allocator
statistics, JAX's device statistics or live arrays), read at every layer boundary. A capture
sees the layer calls and their windows, not ops: it weighs each innermost layer call by its peak
increase (``captures_ops = False``; ``dumps/capture.py``).

Only eager calls are measured. Inside ``tf.function``, ``jax.jit``, a compiled ``predict``/``fit``
the Python ``call`` runs only while the function is traced, and later calls run the compiled
function without it: the wrappers then pass straight through (the backend's ``eager()`` is False),
so what is traced is the plain model and nothing of ours runs afterwards.
"""
from __future__ import annotations

import functools
import logging
import time
import weakref
from typing import Any, Callable

from ...capacity.shapes import ShapeOf
from ...config import Config
from ...dumps.capture import Capture
from ...errors import CaptureUnsupported, InstrumentationError
from ...sources.base import HotCounter
from ..attaching import attach_handle, tracked_layers
from ..forward_policy import ForwardRecord
from ..forward_state import ForwardState
from ..instrumentation import Instrumentation
from ..keras_tree import is_keras_layer, keras_backend_of, keras_layer_paths
from ..open_forwards import OpenForwards
from .. import kernel_reading
from .backend import KerasBackend

_log = logging.getLogger("memprof_otel")
_perf_counter = time.perf_counter


# The forwards of instrumented Keras models (TF or JAX backend), process-wide: the backends'
# counters are the device's, moved by every thread's (and every model's) arrays.
_OPEN = OpenForwards()


class _ThreadLocal(ForwardRecord):
    sink: ForwardState | None = None   # the forward while layer calls go to it (not a root reading)
    overlapped = False


class KerasInstrumentation(Instrumentation):
    """The handle of a Keras model on ``backend``: the instance ``call`` wrappers and the per-thread
    forward around the framework-neutral handle (``attribution/instrumentation.py``)."""

    def __init__(self, model: Any, name: str, config: Config, backend: KerasBackend,
                 shape_of: ShapeOf | None = None) -> None:
        super().__init__(name, config, shape_of)
        self._backend = backend
        self._eager = backend.eager
        self._model_ref = weakref.ref(model)
        self._root_key = id(model)
        tree = keras_layer_paths(model)
        self._paths: dict[int, str] = tracked_layers(dict(tree), name, config.attribution)
        self._paths[id(model)] = ""
        # every tracked layer, in tree order (the root first): what gets a wrapper. Weak, like the
        # model: a handle (kept by the registry until uninstrumented) must not keep them alive
        self._layers = [weakref.ref(layer) for _, layer in tree if id(layer) in self._paths]
        self._tls = _ThreadLocal()
        # layer id -> (our wrapper, the instance ``call`` it replaced or _NONE): what _detach undoes
        self._wrapped: dict[int, tuple[Callable[..., Any], Any]] = {}
        device = backend.device()
        self.last_device = backend.device_label(device)
        self._method = backend.method(device)
        self._how = backend.how(device)
        self._counter: HotCounter | None = None
        self._no_figures = ""  # why the backend gives no figures here, when it gives none
        try:
            self._counter = backend.counter(device)
        except (ValueError, RuntimeError) as e:  # a backend that keeps no figures there
            self._no_figures = f"{backend.title} gives no memory figures for {device} ({e})"
            _log.warning("memprof_otel: model %r: %s; no per-layer figures, forwards are counted",
                         name, self._no_figures)
        self._attach()

    # ---- what the neutral handle asks of an adapter ------------------------------------------
    @property
    def model(self) -> Any:
        return self._model_ref()

    @property
    def paused(self) -> bool:
        return not self._wrapped

    @property
    def layer_count(self) -> int:
        return len(self._paths)

    @property
    def attribution_method(self) -> str:
        return self._method

    def figures_note(self) -> str:
        if self._no_figures:
            return f"none: {self._no_figures}"
        how = self._how
        return f"{self._method} ({how})" if how else self._method

    def layer_objects(self) -> list[tuple[str, Any]]:
        model = self._model_ref()
        return list(keras_layer_paths(model)) if model is not None else []

    def object_paths(self) -> dict[int, str]:
        model = self._model_ref()
        return {id(layer): p for p, layer in keras_layer_paths(model)} if model is not None else {}

    def _attach(self) -> None:
        for ref in self._layers:
            layer = ref()
            if layer is None:
                continue
            before = layer.__dict__.get("call", _NONE)  # an instance ``call`` someone set already
            inner = layer.call
            wrapper = (_root_wrapper(self, inner) if id(layer) == self._root_key
                       else _layer_wrapper(self, layer, inner))
            layer.call = wrapper
            self._wrapped[id(layer)] = (wrapper, before)

    def _detach(self) -> None:
        wrapped, self._wrapped = self._wrapped, {}
        for ref in self._layers:
            layer = ref()
            entry = wrapped.get(id(layer)) if layer is not None else None
            if layer is None or entry is None or layer.__dict__.get("call") is not entry[0]:
                continue  # not ours now (someone replaced it since): left as it is
            if entry[1] is _NONE:
                del layer.call  # the class's ``call`` again
            else:
                layer.call = entry[1]

    def _reattach(self) -> None:
        self._attach()

    # No dispatch to hook on these backends: a capture weighs each innermost layer call by its
    # peak increase (the layer calls and their times are recorded as on torch)
    captures_ops = False

    def capture(self, forwards: int = 1) -> Capture:
        if self._counter is None:
            raise CaptureUnsupported(f"{self.name!r}: the {self._backend.title} backend gives no memory "
                                     f"figures on {self.last_device}, so a capture would weigh nothing")
        return super().capture(forwards)

    # ---- one forward -------------------------------------------------------------------------
    def _root_call(self, inner: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                   key: int, path: str) -> Any:
        """A forward opened by the layer ``key`` at ``path``: the model (``""``), or one of its
        layers called on its own (serving code calling an encoder), as the torch adapter does."""
        tls = self._tls
        if tls.depth or self._closed:
            # the root called again inside its own forward (its frame covers it), or a call that
            # was in flight when the model was uninstrumented
            tls.depth += 1
            try:
                return inner(*args, **kwargs)
            finally:
                tls.depth -= 1
        t = _perf_counter()
        tls.depth = 1
        tls.start_s = t
        self._open(tls, t, args, kwargs, key, path)
        tls.self_time_s = _perf_counter() - t
        raised = True
        exc: BaseException | None = None
        try:
            out = inner(*args, **kwargs)
            raised = False
            return out
        except Exception as e:
            exc = e
            raise
        finally:
            # also on a BaseException (KeyboardInterrupt): the forward ends here whatever happened
            tls.depth = 0
            self._close(tls, _perf_counter(), raised, exc)

    def _open(self, tls: _ThreadLocal, t: float, args: tuple[Any, ...], kwargs: dict[str, Any],
              key: int, path: str) -> None:
        tls.opened = _OPEN.open()
        tls.overlapped = _OPEN.another_thread_open()
        tls.state = tls.sink = None
        tls.shape = tls.features = None
        tls.capture = None
        counter = self._counter
        policy = self._policy
        try:
            if counter is not None:
                policy.choose(self, tls, key, path, t, args, kwargs)
            if tls.state is not None:
                tls.state.begin(t)
                if tls.shape:  # on CPU, the forward's rise of the process's resident memory too;
                    # a GPU's figures here are TensorFlow's or JAX's, not torch's allocator's
                    tls.state.kernel = kernel_reading.begin(self.last_device, tls.overlapped, cuda=False)
        except Exception as e:  # never into the model: this forward runs unmeasured
            tls.state = tls.sink = None
            self._count_error("begin", e)
        if policy.flight:  # also where the backend gives no figures: a post-mortem names the forward
            try:
                policy.flight_begin(self, tls, path, args, kwargs)
            except Exception as e:
                self._count_error("begin", e)

    def _begin_attributed(self, opener: Any, path: str, t: float, cap: Capture | None, compiled: bool) -> None:
        tls = self._tls
        tls.capture = cap  # released in _close whatever happens next
        state = self._new_state(self._counter, opener, path, root_only=False)  # type: ignore[arg-type]
        self._notify(lambda obs: obs.forward_begin(self, state))
        tls.state = tls.sink = state
        if cap is not None:
            state.listener = cap
            cap.forward_started(t, self._policy.capture_operation(self))

    def _begin_root_reading(self, opener: Any, t: float) -> None:
        # a forward left plain, read at its root only, for the memory model: two reads
        self._tls.state = self._new_state(self._counter, opener, "", root_only=True)  # type: ignore[arg-type]

    def _new_state(self, counter: HotCounter, key: int, path: str, root_only: bool) -> ForwardState:
        state = ForwardState(self._paths, key, path, counter, self._origin_s, 0, self._count_error,
                             record_events=not root_only and self._events.maxlen != 0)
        state.root_only = root_only
        state.shared_counter = True
        state.overlapped = self._tls.overlapped
        return state

    def _close(self, tls: _ThreadLocal, t: float, raised: bool, exc: BaseException | None) -> None:
        self._policy.flight_end(self, tls)
        _OPEN.close()
        state = tls.state
        tls.state = tls.sink = None
        if raised:
            self.forward_errors += 1
            if exc is None:
                self.interrupted_forwards += 1  # a BaseException: counted as raised too
        self_time = tls.self_time_s
        root = None
        if state is not None:
            try:
                calls = state.finish(t, raised)
                root = calls[-1] if calls and calls[-1].path == state.root_path else None
                shape, tls.shape = tls.shape, None
                alone = not state.overlapped and _OPEN.ran_alone(tls.opened)
                state.kernel = kernel_reading.end(state.kernel, alone and not raised)
                self._publish(state, calls, t, raised, shape, None if alone else "concurrent")
            except Exception as e:
                self._count_error("finish", e)
            self_time += state.self_time_s
        self._policy.end(self, tls, state, t, self_time, root, raised, exc)


class _NoInstanceCall:
    """Marks a layer that had no instance ``call`` before ours (``del`` restores the class's)."""


_NONE = _NoInstanceCall()


def _root_wrapper(h: KerasInstrumentation, inner: Callable[..., Any]) -> Callable[..., Any]:
    eager = h._eager

    @functools.wraps(inner)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not eager():
            return inner(*args, **kwargs)  # being traced into a graph: the plain model's
        return h._root_call(inner, args, kwargs, h._root_key, "")
    return call


def _layer_wrapper(h: KerasInstrumentation, layer: Any, inner: Callable[..., Any]) -> Callable[..., Any]:
    tls = h._tls
    eager = h._eager

    key, path = id(layer), h._paths[id(layer)]

    @functools.wraps(inner)
    def call(*args: Any, **kwargs: Any) -> Any:
        state = tls.sink
        if state is None or not eager():
            if not tls.depth and eager():
                # outside any forward of the model on this thread: the layer's own forward
                return h._root_call(inner, args, kwargs, key, path)
            return inner(*args, **kwargs)  # a forward left plain, or being traced
        state.enter(layer)
        try:
            out = inner(*args, **kwargs)
        except BaseException:
            state.exit(layer, True)
            raise
        state.exit(layer, False)
        return out
    return call


def attach_for(backend: KerasBackend) -> Callable[..., KerasInstrumentation]:
    """The ``attach`` of the adapter with ``backend``'s parts: ``attach(model, name, config,
    shape_of, **overrides)`` wraps the layers of a Keras model on that backend and returns its
    handle, not yet connected to any exporter (``mp.instrument`` hands it to the process runtime)."""

    def attach(model: Any, name: str | None = None, config: Any = None, shape_of: ShapeOf | None = None,
               **overrides: Any) -> KerasInstrumentation:
        if not is_keras_layer(model) or keras_backend_of(model) != backend.name:
            raise InstrumentationError(f"this adapter takes a Keras 3 model on the {backend.title} backend, "
                                       f"got {type(model).__module__}.{type(model).__qualname__}")
        return attach_handle(model, name, config, shape_of, overrides,
                             lambda chosen, cfg: KerasInstrumentation(model, chosen, cfg, backend, shape_of))
    return attach


__all__ = ["KerasInstrumentation", "attach_for"]
