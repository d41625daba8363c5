"""An independent reference for per-layer tensor memory: what every module call really did.

Written from scratch for the exact-workload tests; it imports nothing from ``memprof_otel`` and
deliberately does not share its method, so agreement between the two means something.

What it counts
--------------
The *level* is the total ``nbytes`` of every live tensor storage on one device type (CPU here),
including every storage that existed before the run. Each module call of the instrumented model
yields one record ``(path, peak_increase, retained)``:

* ``peak_increase`` = highest level reached while the call was open (children included) minus the
  level at entry;
* ``retained`` = level at exit minus level at entry (negative when the call freed storage that
  existed before it, e.g. a KV cache replaced by ``torch.cat`` or a state tensor swapped out).

How it counts (and why it is independent of the library)
--------------------------------------------------------
1. On ``__enter__`` every storage already alive is registered: a walk of ``gc.get_objects()`` for
   ``torch.Tensor`` / ``torch.UntypedStorage`` objects plus ``model.parameters()``/``buffers()``.
   A storage is keyed by ``untyped_storage()._cdata`` (its ``StorageImpl`` address); its bytes are
   remembered and a ``weakref.ref(storage, callback)`` subtracts them when it dies. PyTorch keeps
   a storage's Python object alive exactly as long as the C++ storage, so the callback is the
   storage's death.
2. Its own ``TorchDispatchMode`` looks at every op. Before the op runs, every tensor among the
   args/kwargs (nested containers too) is looked at: a storage never seen before was born outside
   the dispatcher (``torch.tensor(list)`` builds its tensor in C++ and only then calls
   ``aten.lift_fresh``) and is counted now; a known storage whose ``nbytes`` changed since it was
   last seen is re-measured. After the op runs, every tensor among the inputs *and* outputs is looked
   at again: an unseen storage was born in the op (+nbytes, finalizer registered); a known storage
   whose ``nbytes`` changed (``out=`` into a too-small tensor, ``resize_``) adds the difference.
   No schema / alias information is used at all: only "is this a storage I know, and how big is
   it now". The library decides freshness from the op schema; this is plain bookkeeping.
3. Its own process-wide module hooks (``register_module_forward_pre_hook`` and
   ``register_module_forward_hook(..., always_call=True)``) keep a stack of open frames for the
   thread that entered the context. Every level increase raises the peak of every open frame; on a
   module's exit its frame is closed and recorded. A module's path is its name in the instrumented
   root's ``named_modules()`` (the root is ``""``; a shared module keeps its first name), or the
   one the caller gives in ``paths`` (a Keras model, whose layers ``named_modules()`` misses);
   modules outside it are ignored. A submodule called directly, not through the root (HF
   ``generate()`` calls ``model.get_encoder()(...)`` on encoder-decoder models), is recorded under
   its own path with no root frame around it.

Running it beside the library: one run, not two
-----------------------------------------------
The tests run the reference and the library *in the same run*: the reference context is entered
(mode pushed, global hooks registered) before the workload starts and stays active for all of it;
the library pushes its own mode in its root pre-hook, so it is the inner mode and ours the outer:
the library's ``__torch_dispatch__`` runs first, its ``func(...)`` call falls through to ours, and
both see exactly the same ops, and the same storages die at the same instants for both. Two
separate "identical" runs were rejected: allocation sequences would agree, but the instants at
which Python frees things (cyclic GC, interpreter caches) need not, and a reference that is right
only if two runs happen to free at the same moment is not a reference.

The interactions were checked: hooks on either side create and drop no tensors, so whichever
side's hooks run first cannot move a level change across a frame boundary (the test file checks
this assumption: the reference alone and beside the library must give the same calls); each side's
weakref callbacks are independent of the other's; which mode is inner does not matter either, since
no hook boundary can fall between the two modes' bookkeeping of one op. Our mode is popped only on
``__exit__``, after the workload (and with it every library forward) has finished. The cyclic GC is disabled inside the context
(after one ``gc.collect()``) so that a collection cannot start inside one side's hook and free
something between our reading and the library's: every free then happens by reference count, at
a deterministic point.

Diagnostics: ``born_outside_dispatch`` lists (op, bytes) for storages first met as an op *input*
(created without a dispatched op). If a storage that predates the context is missing from the
registration walk (one reachable only from C++), it would show up there and be counted as born at
first sight: look there first when a figure looks wrong.
"""
from __future__ import annotations

import gc
import threading
import weakref
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class Call(NamedTuple):
    """One closed module call: the triple the tests compare, in exit order."""
    path: str
    peak_increase: int
    retained: int


@dataclass
class _Frame:
    key: int
    path: str
    entry: int
    peak: int


class _Storages:
    """Live storages of one device type: key -> [nbytes, weakref]; ``level`` is their byte sum."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.live: dict[int, list[Any]] = {}
        self.level = 0
        self.births = 0
        self.deaths = 0
        self.lock = threading.RLock()
        self.on_increase: Any = None  # called with the new level after every increase

    def storage_of(self, t: Any) -> Any:
        """The tensor's untyped storage on our device, or None (other device, no storage)."""
        try:
            if t.device.type != self.device_type:
                return None
            return t.untyped_storage()
        except Exception:  # sparse / nested / wrapper subclasses: nothing we can measure
            return None

    def add(self, delta: int) -> None:
        with self.lock:
            self.level += delta
            level = self.level
        if delta > 0 and self.on_increase is not None:
            self.on_increase(level)

    def register(self, st: Any, count: bool) -> bool:
        """Start tracking ``st`` if unknown; True when it was unknown. ``count``: add its bytes."""
        key = st._cdata
        with self.lock:
            if key in self.live:
                return False
            n = st.nbytes()
            ref = weakref.ref(st, self._died(key))
            self.live[key] = [n, ref]
            self.births += 1
        if count:
            self.add(n)
        else:
            with self.lock:
                self.level += n
        return True

    def remeasure(self, st: Any) -> None:
        """A known storage: add the difference if its size changed since we last saw it."""
        key = st._cdata
        with self.lock:
            entry = self.live.get(key)
            if entry is None:
                return
            n = st.nbytes()
            delta = n - entry[0]
            entry[0] = n
        if delta:
            self.add(delta)

    def _died(self, key: int) -> Any:
        def callback(ref: Any) -> None:
            with self.lock:
                entry = self.live.get(key)
                if entry is None or entry[1] is not ref:
                    return  # a newer storage at the same address: not ours to remove
                del self.live[key]
                self.level -= entry[0]
                self.deaths += 1
        return callback


class _Mode(TorchDispatchMode):
    def __init__(self, ref: "ReferenceLedger") -> None:
        super().__init__()
        self.ref = ref

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        stores = self.ref.storages
        inputs = [st for st in (stores.storage_of(t) for t in tree_leaves((args, kwargs))
                                if isinstance(t, torch.Tensor)) if st is not None]
        for st in inputs:
            if stores.register(st, count=True):
                self.ref.born_outside_dispatch.append((str(func), st.nbytes()))
            else:
                stores.remeasure(st)
        out = func(*args, **kwargs)
        outputs = [st for st in (stores.storage_of(t) for t in tree_leaves(out)
                                 if isinstance(t, torch.Tensor)) if st is not None]
        for st in inputs + outputs:
            if not stores.register(st, count=True):
                stores.remeasure(st)
        return out


class ReferenceLedger:
    """``with ReferenceLedger(model) as ref: workload()`` then ``ref.calls``.

    Records every call of every module of ``model`` made by the entering thread while the context
    is open, in exit order, as ``Call(path, peak_increase, retained)``.
    """

    def __init__(self, model: nn.Module, device_type: str = "cpu",
                 paths: Mapping[int, str] | None = None) -> None:
        self.model = model  # held so the ids below stay unique
        self.paths: dict[int, str] = {}
        if paths is not None:
            # a tree named_modules() does not give (a Keras model keeps its layers in its own
            # lists): the caller states ``id(module) -> path`` itself, the root included
            self.paths.update(paths)
        else:
            for name, m in model.named_modules():
                self.paths.setdefault(id(m), name)
        self.storages = _Storages(device_type)
        self.storages.on_increase = self._raise_peaks
        self.calls: list[Call] = []
        self.born_outside_dispatch: list[tuple[str, int]] = []
        self.preexisting_storages = 0
        self.preexisting_bytes = 0
        self._frames: list[_Frame] = []
        self.unclosed: list[str] = []
        self._thread = 0
        self._mode: _Mode | None = None
        self._handles: list[Any] = []
        self._gc_was_enabled = False

    @property
    def level(self) -> int:
        return self.storages.level

    # ---- context -----------------------------------------------------------------------------
    def __enter__(self) -> "ReferenceLedger":
        self._thread = threading.get_ident()
        self._gc_was_enabled = gc.isenabled()
        gc.collect()
        gc.disable()
        self._register_existing()
        self._mode = _Mode(self)
        self._mode.__enter__()
        self._handles = [register_module_forward_pre_hook(self._pre),
                         register_module_forward_hook(self._post, always_call=True)]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unclosed = [f.path for f in self._frames]  # frames never exited (should be empty)
        self._frames.clear()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        if self._gc_was_enabled:
            gc.enable()

    def _register_existing(self) -> None:
        stores = self.storages
        seen: list[Any] = []
        objs = gc.get_objects()
        try:
            for o in objs:
                try:
                    cls = type(o)  # not isinstance: that reads __class__ of lazy proxies (warnings)
                    if issubclass(cls, torch.Tensor):
                        st = stores.storage_of(o)
                    elif issubclass(cls, torch.UntypedStorage):
                        st = o if o.device.type == stores.device_type else None
                    else:
                        continue
                except Exception:
                    continue
                if st is not None:
                    seen.append(st)
        finally:
            del objs
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            st = stores.storage_of(t)
            if st is not None:
                seen.append(st)
        for st in seen:
            if stores.register(st, count=False):
                self.preexisting_storages += 1
        seen.clear()
        self.preexisting_bytes = stores.level

    # ---- frames ------------------------------------------------------------------------------
    def _raise_peaks(self, level: int) -> None:
        for f in self._frames:
            if level > f.peak:
                f.peak = level

    def _pre(self, module: nn.Module, args: Any) -> None:
        if threading.get_ident() != self._thread:
            return
        path = self.paths.get(id(module))
        if path is None:
            return
        level = self.storages.level
        self._frames.append(_Frame(id(module), path, level, level))

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() != self._thread:
            return
        key = id(module)
        if key not in self.paths or not any(f.key == key for f in self._frames):
            return
        level = self.storages.level
        while True:
            f = self._frames.pop()
            peak = max(f.peak, level)
            self.calls.append(Call(f.path, peak - f.entry, level - f.entry))
            if self._frames:
                parent = self._frames[-1]
                parent.peak = max(parent.peak, peak)
            if f.key == key:
                return


def reference_root_peak(model: torch.nn.Module, run: Callable[[], Any]) -> int:
    """The root call's peak increase by the reference, over one ``run()`` of ``model`` (the library's
    handle must be paused, or it would be measuring its own forward too)."""
    with ReferenceLedger(model) as ref, torch.no_grad():
        run()
    roots = [c for c in ref.calls if c.path == ""]
    assert len(roots) == 1, roots
    return roots[0].peak_increase
