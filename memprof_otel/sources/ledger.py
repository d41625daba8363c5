"""The exact tensor ledger: storage bytes allocated by the ops of one thread, freed by weakref.

A ``TorchDispatchMode`` sees every aten op a thread runs (composite ops after decomposition). An op
output whose schema return does not alias an input is a fresh allocation: its storage's bytes are
added, and a weakref on the storage's Python object (which PyTorch keeps alive exactly as long as
the storage itself) subtracts them when the storage dies, in whatever thread drops it last.

Limits, written down in docs/design.md: scratch memory a single kernel allocates and frees inside
itself (oneDNN/MKL workspaces, fused attention) is invisible; storages resized in place through
``out=`` are re-measured only when the output storage is already known; the level counts only
storages born under the ledger (``baseline`` in the attribution adds the host allocator level).
Cost: ~5.6 us per simple op (measured, docs/benchmarks.md), so the ledger runs only on attributed
forwards and deep captures, never always-on.
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


def _fresh_returns(func: Any) -> tuple[bool, ...]:
    """For each return of ``func``'s schema: True when it cannot alias an input (a new storage)."""
    try:
        return tuple(r.alias_info is None for r in func._schema.returns)
    except AttributeError:  # not an OpOverload with a schema: treat every output as possibly new
        return ()


class TensorLedger:
    """Live bytes of storages allocated under it. ``reading()``/``reset_peak()`` feed the tracker."""

    name = "cpu"

    def __init__(self, device_type: str = "cpu") -> None:
        self.device_type = device_type
        self._lock = threading.Lock()
        self._live: dict[int, tuple[int, weakref.ref[Any]]] = {}
        self.current = 0
        self.peak = 0
        self.allocations = 0
        self.frees = 0
        self.listener: AllocListener | None = None

    # -- MemorySource-shaped surface ------------------------------------------------------
    def allocated(self) -> int:
        return self.current

    def reserved(self) -> int:
        return self.current  # the ledger keeps no cache: reserved is what is allocated

    def peak_since_reset(self) -> int:
        return self.peak

    def reset_peak(self) -> None:
        self.peak = self.current

    def read_and_reset(self) -> Reading:
        r = self.reading()
        self.peak = self.current
        return r

    def stats(self) -> dict[str, float]:
        return {"allocated_bytes": self.current, "allocated_peak_bytes": self.peak,
                "allocations": self.allocations, "frees": self.frees, "live_storages": len(self._live)}

    def reading(self) -> Reading:
        c = self.current
        return Reading(c, c, self.peak, self.allocations, self.frees, 0.0, self.peak)

    # -- bookkeeping ----------------------------------------------------------------------
    def observe(self, func: Any, out: Any) -> None:
        fresh = _FRESH.get(func)
        if fresh is None:
            fresh = _FRESH[func] = _fresh_returns(func)
        if isinstance(out, torch.Tensor):
            self._observe_one(func, out, fresh[0] if fresh else True)
        elif isinstance(out, (tuple, list)):
            for i, o in enumerate(out):
                f = fresh[i] if i < len(fresh) else True
                if isinstance(o, torch.Tensor):
                    self._observe_one(func, o, f)
                elif isinstance(o, (tuple, list)):  # Tensor[] returns (split, unbind, ...)
                    for t in o:
                        if isinstance(t, torch.Tensor):
                            self._observe_one(func, t, f)

    def _observe_one(self, func: Any, t: torch.Tensor, fresh: bool) -> None:
        if t.device.type != self.device_type:
            return
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
                    if key in self._live:
                        self._live[key] = (n, known[1])
                        self._add(n - known[0])
            return
        if not fresh:
            return  # a view or in-place result on a storage born before the ledger
        n = st.nbytes()
        ref = weakref.ref(st, self._make_free_cb(key))
        with self._lock:
            self._live[key] = (n, ref)
            self.allocations += 1
            self._add(n)
        if self.listener is not None:
            self.listener(func, n)

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

    def forget(self) -> None:
        """Stop tracking what is live (its frees will no longer be counted)."""
        with self._lock:
            self._live.clear()
            self.current = self.peak = 0


_FRESH: dict[Any, tuple[bool, ...]] = {}


class LedgerMode(TorchDispatchMode):
    """Routes every op's outputs into a ledger; the op itself runs unchanged (same kernels)."""

    def __init__(self, ledger: TensorLedger, on_error: Callable[[BaseException], None] | None = None) -> None:
        super().__init__()
        self.ledger = ledger
        self.on_error = on_error

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        try:
            self.ledger.observe(func, out)
        except Exception as e:  # telemetry must never break the op
            if self.on_error is not None:
                self.on_error(e)
        return out
