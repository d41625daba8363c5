"""``instrument(model)``: the torch adapter over the pure accounting in ``attribution/``.

Always on: one forward pre-hook and one ``always_call`` forward hook on the root module (a few
microseconds per forward; the hook objects are ``root_hooks.py``'s). On forwards the forward policy
picks, the root pre-hook also routes this thread's module calls to a ``ForwardState`` through
process-wide hooks (``hooks.py``) and, on CPU, pushes the tensor ledger; the root post-hook undoes
both and folds the calls into the stats.
"""
from __future__ import annotations

import itertools
import sys
import threading
import time
import weakref
from typing import Any, Callable

import torch
from torch import nn

from . import held, hooks
from .root_hooks import CompiledCall, DisarmedWatch, ForwardArgs, ReleaseWatch, RootHook
# a model pickled by an earlier release names its inert hook here: it still loads
from .root_hooks import InertHook as _InertHook  # noqa: F401
from ...sources import torch_compat as _torch_compat
from ..._log import rate_limited
from ...sources.torch_compat import is_optimized_module as _is_optimized_module
from ...sources.torch_compat import get_current_dispatch_mode as _get_current_dispatch_mode
from ...capacity.shapes import ShapeOf
from ...config import Config
from ...dumps.capture import Capture
from ...errors import InstrumentationError
from ..keras_tree import is_keras_layer, keras_layer_paths
from ...sources import registry
from ...sources.cuda import CudaPeakWatch
from ...sources.glibc import HeapLevelCounter
from ...sources.ledger import LedgerMode, TensorLedger
from ..attaching import attach_handle, tracked_layers
from ..forward_policy import ForwardRecord
from ..forward_state import ForwardState
from .. import kernel_reading
from ..instrumentation import Instrumentation
from ..open_forwards import OpenForwards
from ..selection import OTHER
from ..traced_forward import TracedForwardState

_LEDGER_DOWN: str | None = _torch_compat.ledger_reason()  # why CPU attribution cannot run, if so
_CALL_IMPL_CODE = nn.Module._call_impl.__code__
# Every instrumented torch forward, process-wide: an attributed forward that reads the CUDA
# allocator at its boundaries sees every thread's allocations on the device, so it must know
# whether another forward ran meanwhile.
_OPEN = OpenForwards()




def _share_counter(state: ForwardState, shared: bool) -> None:
    """Mark a forward whose counter is the device's (CUDA allocator statistics), shared by every
    thread: its figures hold only if no other forward runs meanwhile, checked now (another thread
    has one open) and again at its end (``_dropped``)."""
    state.shared_counter = shared
    state.overlapped = shared and _OPEN.another_thread_open()


class _ThreadLocal(ForwardRecord):
    open_key: int | None = None  # id of the module whose call opened this thread's forward
    mode: LedgerMode | None = None
    busy = False                 # inside our own hook code (a __del__ must not interleave)


class TorchInstrumentation(Instrumentation):
    """The handle of a torch model: the root hooks, the compile switch and the per-thread forward
    machine around the framework-neutral handle (``attribution/instrumentation.py``), and the
    counter each attributed forward reads."""

    def __init__(self, model: nn.Module, name: str, config: Config, shape_of: ShapeOf | None = None) -> None:
        super().__init__(name, config, shape_of)
        self._model_ref = weakref.ref(model)
        self._root_key = id(model)
        acfg = config.attribution
        # torch.compile(m) wraps m: layer paths are m's own (no "_orig_mod." prefix)
        tree = model._orig_mod if _is_optimized_module(model) else model
        self._paths: dict[int, str] = tracked_layers(dict(_layer_paths(tree)), name, acfg)
        self._paths[id(model)] = ""
        # label -> module id for the modules a forward may open on (ownership check of hooks)
        self._path_keys: dict[str, int] = {label: key for key, label in self._paths.items()}
        self._tls = _ThreadLocal()
        # thread ident -> (state, mode) of attributed forwards in flight (for uninstrument's cleanup)
        self._open: dict[int, tuple[ForwardState, LedgerMode | None]] = {}
        self._open_lock = threading.Lock()
        self._wrapped: CompiledCall | None = None  # our stand-in for an m.compile()d root's call
        # the forward that opened while m.compile() replaced our hooks: closed when its args go
        self._close_on_release: ForwardState | None = None
        self._handles: list[Any] = []
        # module id -> a weak reference to one of its tensors: where a forward opened by it runs
        self._device_probes: dict[int, Callable[[], torch.Tensor | None]] = {}
        # the KV cache the root forward was last called with, held weakly (the memory breakdown)
        self._cache_tensors: Callable[[], list[torch.Tensor]] = _no_tensors
        self._cache_ref: Callable[[], Any] = _no_tensor
        self._weights = held.WeightWalker()
        self._attach(model)

    # ---- public API ------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module | None:
        return self._model_ref()

    def _attach(self, model: nn.Module) -> None:
        if getattr(model, "_compiled_call_impl", None) is not None:
            self._wrap_compiled_call(model)
            return
        handles = []
        for path, mod in self._entry_points(model):
            # the root's pre-hook sees keyword arguments too: a forward's shape is often only there
            # (generate() calls model(**inputs)); other entry points need only their positional args
            handles.append(mod.register_forward_pre_hook(RootHook(self, True, path, path == ""),
                                                         with_kwargs=path == ""))
            handles.append(mod.register_forward_hook(RootHook(self, False, path), always_call=True))
        self._handles = handles

    def _entry_points(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """Modules whose call may open a forward: the root, and the submodules that serving code
        calls directly (HF ``generate()`` runs ``model.get_encoder()(...)`` outside the root).

        Those are the tracked children of the root and what ``get_encoder()``/``get_decoder()``
        return. Their hooks cost ~1 us per call inside a root forward, so deeper modules are not
        hooked; nothing inside an ``nn.TransformerEncoderLayer`` is (a local hook there turns off
        its fused fast path).
        """
        points: dict[int, tuple[str, nn.Module]] = {id(model): ("", model)}
        if _is_optimized_module(model):
            return list(points.values())  # its forwards are compiled: root-level figures only
        candidates = _children(model)
        for getter in ("get_encoder", "get_decoder"):
            fn = getattr(model, getter, None)
            if callable(fn):
                try:
                    found = fn()
                except Exception:  # a getter that does not apply to this model
                    found = None
                if isinstance(found, nn.Module):
                    candidates.append(found)
        fused = {id(sub) for m in model.modules() if isinstance(m, nn.TransformerEncoderLayer)
                 for sub in m.modules()}
        for m in candidates:
            path = self._paths.get(id(m))
            if isinstance(m, (nn.ModuleList, nn.ModuleDict)):
                continue  # containers are never called
            if path not in (None, OTHER) and id(m) not in fused and id(m) not in points:
                points[id(m)] = (path, m)
        return list(points.values())

    def _detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        model = self._model_ref()
        w, self._wrapped = self._wrapped, None
        if w is not None and model is not None and model.__dict__.get("_compiled_call_impl") is w:
            model._compiled_call_impl = w.inner

    def _wrap_compiled_call(self, model: nn.Module) -> None:
        """``m.compile()``d root: an eager wrapper around the compiled call, no local hook.

        ``Module._wrapped_call_impl`` calls ``_compiled_call_impl`` when set; our wrapper there runs
        outside the compiled region. A local hook would not do: on a torch.nn builtin (an
        ``nn.Sequential``) any hook makes Dynamo compile a forward the user's compile left eager,
        and so change its outputs.
        """
        w = CompiledCall(self, model._compiled_call_impl)
        model._compiled_call_impl = w
        self._wrapped = w
        self._handles = [w]

    @property
    def layer_count(self) -> int:
        return len(self._paths)

    @property
    def attribution_method(self) -> str:
        return "cuda caching allocator" if self.last_device.startswith("cuda") else "tensor ledger"

    @property
    def paused(self) -> bool:
        return not self._handles

    def _reattach(self) -> None:
        model = self._model_ref()
        if model is not None:
            self._attach(model)

    def layer_objects(self) -> list[tuple[str, Any]]:
        model = self._model_ref()
        return _layer_paths(model) if model is not None else []

    def object_paths(self) -> dict[int, str]:
        """``id(module) -> module path`` for every module of the model, tracked or not (for a
        Keras model, every Keras layer: the paths its figures are kept under)."""
        model = self._model_ref()
        return {id(m): p for p, m in _layer_paths(model)} if model is not None else {}

    # ---- hooks -----------------------------------------------------------------------------
    def _on_pre(self, module: nn.Module, path: str, args: Any, under_dynamo: bool = False,
                kwargs: dict[str, Any] | None = None) -> Any:
        if (under_dynamo and path == "" and getattr(module, "_compiled_call_impl", None) is not None
                and not isinstance(module._compiled_call_impl, CompiledCall) and not self._closed and self._owns(module, path)):
            # m.compile() after instrument(): drop our local hooks before Dynamo looks at forward
            # (hooks on a torch.nn builtin make it compile), wrap the compiled call for
            # later forwards; this forward closes when _call_impl releases its args
            self._detach()
            self._wrap_compiled_call(module)
            switching = True
        else:
            switching = False
        key = id(module)
        tls = self._tls
        if tls.open_key is not None:
            if key != tls.open_key and path:
                return  # a hooked submodule inside this thread's open forward: the hot path
            if self._still_running(tls.open_key, 1 if key == tls.open_key else 0):
                if key == tls.open_key:
                    tls.depth += 1  # the opener called recursively
                return
            # the open forward never closed: a BaseException (KeyboardInterrupt, CancelledError,
            # SystemExit) skipped PyTorch's always_call hooks while it unwound
            self._recover(tls)
        if self._closed or not self._owns(module, path):
            return
        t = time.perf_counter()
        tls.open_key = key
        tls.depth = 1
        tls.start_s = t
        tls.opened = _OPEN.open()
        tls.state = None
        tls.features = None
        tls.busy = True
        try:
            if kwargs and not path:
                self._note_cache(kwargs)
            policy = self._policy
            if hooks.active_sink() is None:
                compiled = (under_dynamo or _is_optimized_module(module)
                            or getattr(module, "_compiled_call_impl", None) is not None)
                policy.choose(self, tls, module, path, t, args, kwargs, compiled)
                if tls.state is not None and tls.shape:
                    # the forward in the units its limit counts (process RSS, CUDA reserved); not
                    # CUDA's under cuda.attribution: trace, whose point is one allocator read a forward
                    tls.state.kernel = kernel_reading.begin(self.last_device, _OPEN.another_thread_open(),
                                                            cuda=self.config.cuda.attribution != "trace",
                                                            level=getattr(tls.state, "base_allocated", None))
            if policy.flight:
                policy.flight_begin(self, tls, path, args, kwargs)
        except Exception as e:
            self._abort_attribution()
            self._count_error("begin", e)
        finally:
            tls.busy = False
        tls.self_time_s = time.perf_counter() - t
        if switching and tls.state is not None:  # our post-hook is gone: close when args are released
            self._close_on_release = tls.state
            return ForwardArgs(args, ReleaseWatch(self, threading.get_ident(), tls.state))
        if tls.state is None or under_dynamo or tls.mode is None:
            return None
        # An attributed forward changed this thread (dispatch mode, global hooks). PyTorch runs
        # always_call hooks on Exception only: a KeyboardInterrupt, CancelledError or SystemExit
        # skips our post-hook. ``_call_impl`` holds the args tuple until the call is over, so a
        # tuple that tells us when it dies restores the thread as soon as the unwinding is done.
        return ForwardArgs(args, ReleaseWatch(self, threading.get_ident(), tls.state))

    def _note_cache(self, kwargs: dict[str, Any]) -> None:
        """Remember the KV cache this forward is called with (the same ``Cache`` object on every
        step of a ``generate()``: then nothing is done)."""
        cache = held.cache_argument(kwargs)
        if cache is None or cache is self._cache_ref():
            return
        self._cache_tensors = held.remember(cache)
        try:
            self._cache_ref = weakref.ref(cache)
        except TypeError:  # a legacy tuple: a new one every step
            self._cache_ref = _no_tensor

    def held_tensors(self) -> dict[str, dict[tuple[str, int], int]]:
        """The model's weights and its last KV cache by storage (``attribution/torch/held.py``)."""
        model = self._model_ref()
        weights = self._weights(model) if model is not None else {}
        cache: held.StorageMap = {}
        held.add_storages(self._cache_tensors(), cache)
        return {"weights": weights, "kv_cache": cache}

    def _on_post(self, module: nn.Module, output: Any, args: Any = None) -> None:
        tls = self._tls
        if tls.open_key != id(module):
            return  # not the opener (or hooks registered mid-forward: we never saw its pre-hook)
        if tls.depth > 1:
            tls.depth -= 1
            return
        t = time.perf_counter()
        raised = output is None and sys.exc_info()[0] is not None
        tls.busy = True
        try:
            self._close(tls, t, raised, sys.exc_info()[1] if raised else None)
            if type(args) is ForwardArgs:  # what our pre-hook returned, passed back by PyTorch
                # closed: nothing is left to do when the args are freed, so their finalizer goes
                # (no frame of ours runs at that free, where a pending Ctrl-C would be raised and
                # lost). Not before the close: a Ctrl-C inside it leaves the finalizer to finish.
                args._owner.__class__ = DisarmedWatch
        finally:
            tls.busy = False

    def _args_released(self, ident: int, state: ForwardState) -> None:
        """The opener's call is over; if its forward is still open, a BaseException skipped the
        post-hook: recover now (only on the owning thread, never inside our own hook code, where
        the next forward's pre-hook or ``uninstrument()`` will do it instead)."""
        tls = self._tls
        if threading.get_ident() == ident and tls.state is state and not tls.busy:
            tls.busy = True
            try:
                if self._close_on_release is state:
                    self._close_on_release = None
                    self._close(tls, time.perf_counter(), False, None)
                    return
                self._recover(tls)
            finally:
                tls.busy = False

    def _owns(self, module: nn.Module, path: str) -> bool:
        # a deep copy of the model carries our hook dicts: its modules are not ours to count
        return (self._root_key if path == "" else self._path_keys.get(path)) == id(module)

    def _close(self, tls: _ThreadLocal, t: float, raised: bool, exc: BaseException | None) -> None:
        tls.open_key = None
        tls.depth = 0
        self._policy.flight_end(self, tls)
        _OPEN.close()
        if raised:
            self.forward_errors += 1
        state = tls.state
        self_time = tls.self_time_s
        if state is not None:
            try:
                self._finish(state, t, raised)
            except Exception as e:
                self._count_error("finish", e)
            finally:
                self._abort_attribution()
            self_time += state.self_time_s
        self._policy.end(self, tls, state, t, self_time, None, raised, exc)  # the per-op view weighs a capture

    @staticmethod
    def _still_running(key: int, calls_now: int = 0) -> bool:
        """Is the call of module ``key`` that opened the forward still on this thread's stack?

        ``calls_now``: calls of that module on the stack that are not the opener (1 when asked
        from inside a new call of the same module). Runs only when a forward looks open at a
        point where none should be: recursion of the opener, or an abandoned forward.
        """
        f: Any = sys._getframe(1)
        seen = 0
        while f is not None:
            if f.f_code is _CALL_IMPL_CODE and id(f.f_locals.get("self")) == key:
                seen += 1
                if seen > calls_now:
                    return True
            f = f.f_back
        return False

    def _recover(self, tls: _ThreadLocal) -> None:
        """Close a forward a BaseException abandoned: counted as raised, like a module exception."""
        self.interrupted_forwards += 1
        try:
            self._close(tls, time.perf_counter(), True, None)
        except Exception as e:
            self._count_error("recover", e)
            tls.open_key, tls.depth, tls.state = None, 0, None

    def _close_abandoned(self) -> None:
        tls = self._tls
        if tls.open_key is not None and not self._still_running(tls.open_key):
            self._recover(tls)

    def _release_open_forwards(self) -> None:
        """On uninstrument: close this thread's abandoned forward; neutralise other threads' ones."""
        self._close_abandoned()
        with self._open_lock:
            others = list(self._open.items())
        for ident, (state, mode) in others:
            if mode is not None:
                mode.inert = True  # on another thread's mode stack: we cannot pop it from here
                mode.ledger.close()
            hooks.deactivate_thread(ident, state)

    # ---- attribution -----------------------------------------------------------------------
    def _device_of(self, module: nn.Module) -> torch.device:
        """The device of the module that opens a forward, from one of its tensors remembered per
        module: walking ``parameters()`` on every attributed forward cost ~100 us on GPT-2. The
        tensor object is the same after ``model.to(...)`` (its data moves), so its ``device``
        follows the model. Held weakly: a dropped model must not stay alive through us."""
        probes = self._device_probes
        key = id(module)
        ref = probes.get(key)
        t = ref() if ref is not None else None
        if t is None and (ref is None or ref is not _NO_TENSOR):
            t = _first_tensor(module)
            # a module without tensors (all CPU glue) is remembered too: it is walked once
            probes[key] = weakref.ref(t) if t is not None else _NO_TENSOR
        return _tensor_device(t)

    def _begin_attributed(self, module: nn.Module, path: str, t: float, cap: Capture | None,
                          compiled: bool = False) -> None:
        if cap is not None:
            self._tls.capture = cap  # released in _close whatever happens next
        if compiled:
            self._begin_compiled(module, path, t)
            return
        device = self._device_of(module)
        self.last_device = str(device)
        baseline = 0
        mode = None
        counter: Any
        if device.type == "cuda":
            counter = registry.cuda_allocator(device.index or 0)
            if counter is None:
                return
            if cap is None and self._begin_traced(module, path, t, device.index or 0, counter):
                return
            # cuda.reset_peak_stats false: torch's peak register is the host application's (vLLM
            # profiles with max_memory_allocated); the ledger keeps our per-layer peaks instead
            no_reset = not self.config.cuda.reset_peak_stats
            if no_reset and _LEDGER_DOWN is not None:
                self._begin_compiled(module, path, t)  # root-level figures, the register untouched
                return
            if (cap is not None or no_reset) and _LEDGER_DOWN is None:  # a capture's per-op view needs it too
                mode = LedgerMode(self._ledger("cuda", device), on_error=lambda e: self._count_error("ledger", e))
                max_entries = self.config.dumps.cuda_history_max_entries
                if (cap is not None and cap.history is None and max_entries > 0
                        and registry.cuda_trace_in_flight() == 0):  # on for the capture window only; the
                    # ring is not the capture's while traced forwards hold it (they would switch it off)
                    cap.history = registry.cuda_history_recorder(device.index or 0, max_entries)
                    if cap.history is not None:
                        cap.history.start()
            if no_reset and mode is not None:
                baseline = counter.reading().allocated  # the allocator's level: ledger figures are relative
                counter = mode.ledger
        else:
            if _LEDGER_DOWN is not None:  # no TorchDispatchMode in this torch: root-level figures
                self._begin_compiled(module, path, t)  # from the host heap, as for compiled code
                return
            counter = self._ledger(device.type, device)
            mode = LedgerMode(counter, on_error=lambda e: self._count_error("ledger", e))
            host = registry.host_allocator()
            if host is not None:
                # the sampler's last heap reading: refreshing here ran mallinfo2 (a walk of every
                # free chunk, 0.1-16 ms) inside forwards; the baseline is approximate either way
                baseline = host.reading().allocated
        state = ForwardState(self._paths, id(module), path, counter, self._origin_s, baseline,
                             self._count_error, record_events=self._events.maxlen != 0)
        _share_counter(state, mode is None and device.type == "cuda")
        if mode is not None:
            state.births = mode.ledger
        if cap is not None:
            state.listener = cap
            if mode is not None:
                mode.ledger.listener = cap.on_alloc
            cap.forward_started(t, self._policy.capture_operation(self))
        self._activate(state)
        if mode is not None:
            mode.__enter__()
            self._tls.mode = mode
        with self._open_lock:
            self._open[threading.get_ident()] = (state, mode)
        state.begin(t)

    def _begin_root_reading(self, module: nn.Module, t: float) -> None:
        # a forward left plain, read at its root only, for the memory model
        self._begin_compiled(module, "", t, root_only=True)

    def _activate(self, state: ForwardState) -> None:
        """Tell the observers (one that raises is counted and skipped), then route this thread's
        module calls to ``state``."""
        self._notify(lambda obs: obs.forward_begin(self, state))
        self._tls.state = state
        hooks.activate(state)

    def _begin_traced(self, module: nn.Module, path: str, t: float, index: int, source: Any) -> bool:
        """An attributed CUDA forward over the allocator trace (``cuda.attribution: trace``); False
        when it cannot run here (torch without the trace calls, history recorded by someone else),
        and the caller reads the allocator at every boundary instead."""
        if self.config.cuda.attribution != "trace":
            return False
        trace = registry.cuda_trace(self.config.cuda.trace_max_entries)
        if trace is None:
            return False
        base = source.reading()  # the allocator's level: trace figures are relative to it
        ticket = trace.open()
        if ticket is None:
            return False
        try:
            state = TracedForwardState(self._paths, id(module), path, self._origin_s, 0, self._count_error,
                                       self._events.maxlen != 0, trace=trace, ticket=ticket,
                                       device_index=index, base=base)
            self._activate(state)
        except BaseException:
            trace.close(ticket)
            raise
        with self._open_lock:
            self._open[threading.get_ident()] = (state, None)
        state.begin(t)
        return True

    def _ledger(self, device_type: str, device: torch.device) -> TensorLedger:
        ledger = TensorLedger(device_type)
        if self.survivors is not None:
            ledger.survivors = self.survivors
            ledger.device_label = str(device)
        return ledger

    def _begin_compiled(self, module: nn.Module, path: str, t: float, root_only: bool = False) -> None:
        """A forward that runs compiled code: root-level figures only.

        No global hooks (module hooks do not run inside a compiled region) and no ledger (inductor
        allocates its buffers outside the dispatcher: a ledger would read 0). On CUDA the caching
        allocator's counters see everything the compiled code allocates: peak and retained exact.
        On CPU the host heap's in-use bytes are read at entry and exit: approximate. With
        ``cuda.reset_peak_stats: false`` the CUDA register is only watched (``CudaPeakWatch``):
        a peak above every earlier one is exact, others read as the level (a lower bound).

        ``root_only``: the same reading of a forward the scheduler left plain, for the memory model
        (``capacity.root_readings``), CUDA only: on CPU a root figure needs the ledger, which is what
        an attributed forward costs.
        """
        device = self._device_of(module)
        if root_only and device.type != "cuda":
            return
        self.last_device = str(device)
        counter: Any = None
        if device.type == "cuda":
            counter = registry.cuda_allocator(device.index or 0)
            if counter is not None and not self.config.cuda.reset_peak_stats:
                counter = CudaPeakWatch(counter)  # reads the peak register, never resets it
        else:
            host = registry.host_allocator()
            counter = HeapLevelCounter(host) if host is not None else None
        if counter is None:
            return
        state = ForwardState(self._paths, id(module), path, counter, self._origin_s, 0,
                             self._count_error, record_events=not root_only and self._events.maxlen != 0)
        state.root_only = root_only
        _share_counter(state, device.type == "cuda")
        self._tls.state = state
        state.begin(t)

    def _finish(self, state: ForwardState, t: float, raised: bool) -> None:
        alone = _OPEN.ran_alone(self._tls.opened)  # asked once: each ask counts as an opening
        state.kernel = kernel_reading.end(state.kernel, alone and not raised)
        self._pop_mode()
        calls = state.finish(t, raised)
        shape, self._tls.shape = self._tls.shape, None
        self._publish(state, calls, t, raised, shape, self._dropped(state, alone))

    def _dropped(self, state: ForwardState, alone: bool) -> str | None:
        """Why this forward's figures must not be published, or None."""
        if state.lost is not None:
            return "trace_lost"
        if state.shared_counter and (state.overlapped or not alone):
            return "concurrent"
        return None

    def _pop_mode(self) -> None:
        mode, self._tls.mode = self._tls.mode, None
        if mode is None:
            return
        mode.ledger.close()
        if _get_current_dispatch_mode() is mode:
            mode.__exit__(None, None, None)
        else:  # a mode pushed above ours was abandoned too: ours can only be made to pass through
            mode.inert = True
            rate_limited.warning("mode-order", "memprof_otel: another dispatch mode sits above ours "
                                 "on this thread's stack; ours now passes every op through")

    def _abort_attribution(self) -> None:
        """Leave this thread as if no attribution had started (safe to call twice)."""
        try:
            self._pop_mode()
        except Exception as e:
            self._count_error("mode_exit", e)
        state = self._tls.state
        if state is not None:
            try:
                state.release()  # a traced forward's share of the process-wide trace ring
            except Exception as e:
                self._count_error("release", e)
        if hooks.active_sink() is state and state is not None:
            hooks.deactivate()
        self._tls.state = None
        with self._open_lock:
            self._open.pop(threading.get_ident(), None)



def _layer_paths(model: nn.Module) -> list[tuple[str, Any]]:
    """``(path, module)`` for the model and everything below it that gets figures of its own.

    A Keras 3 model on the torch backend is an ``nn.Module`` whose layers are too, and each layer
    call goes through ``nn.Module.__call__``, so the global hooks see it; but Keras keeps most of
    its layers in its own lists, out of ``named_modules()``: the tree comes from Keras instead.
    """
    if is_keras_layer(model):
        return keras_layer_paths(model)
    return list(model.named_modules())


def _children(model: nn.Module) -> list[Any]:
    """The root's direct children in its layer tree (``_layer_paths``): the depth-1 paths."""
    if is_keras_layer(model):
        return [m for p, m in keras_layer_paths(model) if p and "." not in p]
    return [m for _, m in model.named_children()]


def _no_tensors() -> list[torch.Tensor]:
    return []


def _no_tensor() -> None:
    return None


_NO_TENSOR = _no_tensor  # a "weakref" that is always dead: the module had no tensor


def _first_tensor(module: nn.Module) -> torch.Tensor | None:
    for t in itertools.chain(module.parameters(), module.buffers()):
        return t
    return None


def _tensor_device(t: torch.Tensor | None) -> torch.device:
    return t.device if t is not None else torch.device("cpu")  # no tensor: a CPU-only module


def attach(model: nn.Module, name: str | None = None, config: Any = None, shape_of: ShapeOf | None = None,
           **overrides: Any) -> TorchInstrumentation:
    """Hook ``model`` and return its handle, not yet connected to any exporter: ``mp.instrument``
    does this, then hands the handle to the process runtime. ``config`` None: defaults + env."""
    if not isinstance(model, nn.Module):
        raise InstrumentationError(f"instrument() needs a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.TransformerEncoderLayer):
        rate_limited.warning("fastpath", "memprof_otel: a bare nn.TransformerEncoderLayer as root "
                             "loses its fused fast path to our root hook; instrument its parent")
    h = attach_handle(model, name, config, shape_of, overrides,
                      lambda chosen, cfg: TorchInstrumentation(model, chosen, cfg, shape_of))
    _report_degradations(h)
    return h


def _report_degradations(h: TorchInstrumentation) -> None:
    """Say once, in the log and in ``memprof_source_up``, what this torch cannot give us."""
    if _LEDGER_DOWN is not None and h.config.attribution.enabled:
        registry.mark_down("ledger", _LEDGER_DOWN)
        _torch_compat.warn_once("ledger", "memprof_otel: per-layer attribution on CPU is off: %s; "
                                "root-level figures (host heap), the sampler and CUDA attribution still run", _LEDGER_DOWN)
    if "dynamo" in _torch_compat.missing():
        _torch_compat.warn_once("dynamo", "memprof_otel: %s; torch.compile'd models are not supported",
                                _torch_compat.missing()["dynamo"])
