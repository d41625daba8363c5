"""The exact tensor ledger: live storage bytes of one thread's attributed forward.

A ``TorchDispatchMode`` sees every aten op a thread runs (composite ops after decomposition). The
ledger keeps the level of live storage bytes, relative to the moment it was pushed:

* **births**: an op output on a storage the ledger has not seen, where the schema says the return
  is fresh (no alias annotation), adds the storage's bytes. So does the output of ``lift_fresh``
  (``torch.tensor(data)`` inside a forward): its schema says alias, but its input was built from
  Python data outside the dispatcher a moment before, so the storage is new.
* **deaths**: every storage the ledger knows carries a weakref on its Python object (PyTorch keeps
  that object alive exactly as long as the C++ storage); the callback subtracts its bytes when it
  dies, in whatever thread drops it last.
* **storages born before the forward** (a KV cache, swapped state, ``out=`` buffers) are
  registered, without adding bytes, the first time an op takes them as input or returns them as a
  view. When such a storage dies inside the forward (the previous cache replaced by ``torch.cat``),
  the level drops by its bytes, as the real heap does; when an op resizes it (``out=`` into a too
  small buffer, ``resize_``), the growth is counted.

``close()`` drops every weakref at the end of the forward, so long-lived storages (parameters,
caches) never accumulate callbacks across forwards.

Limits, written down in docs/design.md: scratch memory a single kernel allocates and frees inside
itself (oneDNN/MKL workspaces, fused attention) is invisible; a storage born before the forward
that dies without any op of the forward touching it is not seen. Cost: a few microseconds per op
(docs/benchmarks.md), so the ledger runs only on attributed forwards and deep captures.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .base import Reading

AllocListener = Callable[[Any, int], None]  # (op overload, bytes) for each fresh storage

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter


def _fresh_returns(func: Any) -> tuple[bool, ...]:
    """For each return of ``func``'s schema: True when it is a new storage."""
    if func in _LIFTS:
        return (True,)
    try:
        return tuple(r.alias_info is None for r in func._schema.returns)
    except AttributeError:  # not an OpOverload with a schema: treat every output as possibly new
        return ()


class TensorLedger:
    """Live bytes of storages seen by one forward. ``reading()``/``reset_peak()`` feed the tracker."""

    name = "cpu"

    def __init__(self, device_type: str = "cpu") -> None:
        self.device_type = device_type
        self._lock = threading.Lock()
        # storage key -> [bytes, weakref]; bytes are what the level holds for it
        self._live: dict[int, list[Any]] = {}
        self.current = 0
        self.peak = 0
        self.allocations = 0
        self.frees = 0
        self.listener: AllocListener | None = None
        self.closed = False
        # `t.device.type` costs 0.3 us per call; the is_cpu/is_cuda properties a fifth of that
        if device_type == "cpu":
            self._on_device: Callable[[torch.Tensor], bool] = lambda t: t.is_cpu
        elif device_type == "cuda":
            self._on_device = lambda t: t.is_cuda
        else:
            self._on_device = lambda t: t.device.type == device_type

    # -- MemorySource-shaped surface ------------------------------------------------------
    def allocated(self) -> int:
        return self.current

    def reserved(self) -> int:
        return self.current  # the ledger keeps no cache: reserved is what is allocated

    # a ledger of tensor storages has no heap layout, so no fragmentation figure: readings say
    # None (absent), never 0.0 (which would read as "measured, not fragmented")

    def peak_since_reset(self) -> int:
        return self.peak

    def reset_peak(self) -> None:
        self.peak = self.current

    def read_and_reset(self) -> Reading:
        c = self.current
        r = Reading(c, c, self.peak, self.allocations, self.frees, None, self.peak)
        self.peak = c
        return r

    def stats(self) -> dict[str, float]:
        return {"allocated_bytes": self.current, "allocated_peak_bytes": self.peak,
                "allocations": self.allocations, "frees": self.frees, "live_storages": len(self._live)}

    def reading(self) -> Reading:
        c = self.current
        return Reading(c, c, self.peak, self.allocations, self.frees, None, self.peak)

    # -- bookkeeping ----------------------------------------------------------------------
    def see_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> None:
        """Register storages born before the forward that this op takes (before it runs)."""
        for a in args:
            if isinstance(a, _Tensor):
                self._see(a)
            elif type(a) in (list, tuple):
                for t in a:
                    if isinstance(t, _Tensor):
                        self._see(t)
        if kwargs:
            for a in kwargs.values():
                if isinstance(a, _Tensor):
                    self._see(a)
                elif type(a) in (list, tuple):
                    for t in a:
                        if isinstance(t, _Tensor):
                            self._see(t)

    def _see(self, t: torch.Tensor) -> None:
        if type(t) is _Parameter:
            return  # weights outlive every forward: registering them would only cost time
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, or no storage
            return
        key = st._cdata
        if key in self._live or not self._on_device(t):
            return
        self._register(key, st, st.nbytes(), born=False)

    def observe(self, func: Any, out: Any) -> None:
        fresh = _FRESH.get(func)
        if fresh is None:
            fresh = _FRESH[func] = _fresh_returns(func)
        if isinstance(out, _Tensor):
            self._observe_one(func, out, fresh[0] if fresh else True)
        elif isinstance(out, (tuple, list)):
            for i, o in enumerate(out):
                f = fresh[i] if i < len(fresh) else True
                if isinstance(o, _Tensor):
                    self._observe_one(func, o, f)
                elif isinstance(o, (tuple, list)):  # Tensor[] returns (split, unbind, ...)
                    for t in o:
                        if isinstance(t, _Tensor):
                            self._observe_one(func, t, f)

    def _observe_one(self, func: Any, t: torch.Tensor, fresh: bool) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, or no storage
            return
        key = st._cdata
        known = self._live.get(key)
        if known is not None:
            # a known storage came back (in-place / out= op): it may have been resized
            n = st.nbytes()
            if n != known[0]:
                with self._lock:
                    item = self._live.get(key)
                    if item is not None:
                        self._add(n - item[0])
                        item[0] = n
            return
        if not self._on_device(t):
            return
        n = st.nbytes()
        self._register(key, st, n, born=fresh)
        if fresh and self.listener is not None:
            self.listener(func, n)

    def _register(self, key: int, st: Any, n: int, born: bool) -> None:
        ref = weakref.ref(st, self._make_free_cb(key))
        with self._lock:
            if self.closed or key in self._live:
                return
            self._live[key] = [n, ref]
            if born:
                self.allocations += 1
                self._add(n)

    def _add(self, n: int) -> None:
        self.current += n
        if self.current > self.peak:
            self.peak = self.current

    def _make_free_cb(self, key: int) -> Callable[[Any], None]:
        def freed(_ref: Any) -> None:
            with self._lock:
                item = self._live.pop(key, None)
                if item is not None:
                    self.current -= item[0]
                    self.frees += 1
        return freed

    def close(self) -> None:
        """Stop tracking: drop every weakref, so no callback outlives the forward."""
        with self._lock:
            self.closed = True
            self._live.clear()


_FRESH: dict[Any, tuple[bool, ...]] = {}
# ops whose return aliases their input by schema but whose input is a tensor just built outside the
# dispatcher from Python data (torch.tensor): the storage is new to the forward
_LIFTS = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift.default}


class LedgerMode(TorchDispatchMode):
    """Routes every op's inputs and outputs into a ledger; the op itself runs unchanged.

    ``ignore_compile_internals``: inside a ``torch.compile``d region Dynamo would otherwise refuse
    to run compiled code while a user mode is on the stack and fall back to eager for good; with it,
    compiled code runs compiled and the ledger sees only the ops that code dispatches (see
    docs/design.md for what that means for figures).
    """

    def __init__(self, ledger: TensorLedger, on_error: Callable[[BaseException], None] | None = None) -> None:
        super().__init__()
        self.ledger = ledger
        self.on_error = on_error
        self.inert = False  # set when its forward was abandoned: pass every op through untouched

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if self.inert:
            return func(*args, **(kwargs or {}))
        ledger = self.ledger
        if func not in _LIFTS:  # a lift's input is the new storage itself: seen as its output
            try:
                ledger.see_inputs(args, kwargs)
            except Exception as e:  # telemetry must never break the op
                if self.on_error is not None:
                    self.on_error(e)
        out = func(*args, **(kwargs or {}))
        try:
            ledger.observe(func, out)
        except Exception as e:
            if self.on_error is not None:
                self.on_error(e)
        return out
