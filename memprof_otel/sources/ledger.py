"""The exact tensor ledger: live storage bytes of one thread's attributed forward.

A ``TorchDispatchMode`` sees every aten op a thread runs (composite ops after decomposition). The
ledger keeps the level of live storage bytes, relative to the moment it was pushed:

* **births**: an op output on a storage the ledger has not seen, where the schema says the return
  is fresh (no alias annotation), adds the storage's bytes. So does the output of ``lift_fresh``
  (``torch.tensor(data)`` inside a forward): its schema says alias, but its input was built from
  Python data outside the dispatcher a moment before, so the storage is new.
* **deaths**: every storage the ledger knows carries a weakref on its Python object (PyTorch keeps
  that object alive exactly as long as the C++ storage). Its callback is a deque's bound ``append``:
  C code, so no bytecode of ours runs inside the free, where a pending signal (Ctrl-C) would be
  raised in a callback and lost ("Exception ignored in ..."). The queued deaths are folded into the
  level by Python code at safe points: before every birth (so alloc A, free A, alloc B peaks at
  max(A, B), never A + B), before every reading, and before every lookup by storage id (a dead
  storage's id may be reused by a new one while its death is still queued).
* **storages born before the forward** (a KV cache, swapped state, ``out=`` buffers) are
  registered, without adding bytes, the first time an op takes them as input or returns them as a
  view. When such a storage dies inside the forward (the previous cache replaced by ``torch.cat``),
  the level drops by its bytes, as the real heap does; when an op resizes it (``out=`` into a too
  small buffer, ``resize_``), the growth is counted.

``close()`` drops every weakref at the end of the forward, so long-lived storages (parameters,
caches) never accumulate callbacks across forwards; with a ``SurvivorTable`` attached, each storage
born in the forward that is still alive gets a new weakref whose callback queues its death on the
table (with its birth layer: the ``layer`` the attribution hooks set when the storage was born):
surviving bytes per layer, for leak detection (``survivors.py``).

Limits, written down in docs/design.md: scratch memory a single kernel allocates and frees inside
itself (oneDNN/MKL workspaces, fused attention) is invisible; a storage born before the forward
that dies without any op of the forward touching it is not seen. Cost: a few microseconds per op
(docs/benchmarks.md), so the ledger runs only on attributed forwards and deep captures.
"""
from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

# private torch names, feature-detected (a torch without them degrades instead of failing import)
from .torch_compat import DynamoDisabled, TorchDispatchMode
from .torch_compat import eval_frame_callback as _eval_frame_callback, skip_code as _skip_code
from .base import Reading
from .survivors import SurvivorTable

AllocListener = Callable[[Any, int], None]  # (op overload, bytes) for each fresh storage

_Tensor = torch.Tensor
_new_reading = tuple.__new__  # Reading(...) through its Python __new__ costs 3x more, once per hook
_Parameter = torch.nn.Parameter


def _fresh_returns(func: Any) -> tuple[bool, ...]:
    """For each return of ``func``'s schema: True when it is a new storage."""
    if func in _LIFTS:
        return (True,)
    try:
        return tuple(r.alias_info is None for r in func._schema.returns)
    except AttributeError:  # not an OpOverload with a schema: treat every output as possibly new
        return ()


class _StorageRef(weakref.ref):
    """A weakref on a storage that carries what the ledger holds for it: one object per storage,
    where a list, a closure and its cell besides the weakref were four (more allocation, and more
    work for the garbage collector, on every fresh storage of an attributed forward)."""

    __slots__ = ("key", "nbytes", "layer")  # layer: the birth layer (None: born before the forward)


class TensorLedger:
    """Live bytes of storages seen by one forward. ``reading()``/``reset_peak()`` feed the tracker."""

    name = "cpu"

    def __init__(self, device_type: str = "cpu") -> None:
        self.device_type = device_type
        self._lock = threading.Lock()
        self._live: dict[int, _StorageRef] = {}  # id(storage) -> its weakref, holding its bytes
        # weakrefs of dead storages, appended by the weakref callback in whatever thread frees the
        # storage, taken off by ``fold``; append and popleft are atomic. The callback is the
        # deque's bound method, which holds the deque and not the ledger: no reference cycle
        self._dead: deque[_StorageRef] = deque()
        self._freed_cb: Callable[[_StorageRef], None] = self._dead.append
        self.current = 0
        self.peak = 0
        self.allocations = 0
        self.frees = 0
        self.listener: AllocListener | None = None
        self.closed = False
        # the innermost attributed layer now (set by the attribution hooks on every layer enter
        # and exit), recorded on each storage born; and where survivors go at close (None: nowhere)
        self.layer: str | None = None
        self.survivors: SurvivorTable | None = None
        self.device_label = device_type
        # `t.device.type` costs 0.3 us per call; the is_cpu/is_cuda properties a fifth of that
        if device_type == "cpu":
            self._on_device: Callable[[torch.Tensor], bool] = lambda t: t.is_cpu
        elif device_type == "cuda":
            self._on_device = lambda t: t.is_cuda
        else:
            self._on_device = lambda t: t.device.type == device_type

    # -- MemorySource-shaped surface ------------------------------------------------------
    # every figure is read after folding the queued deaths: a level read before would still count
    # storages already freed
    def allocated(self) -> int:
        self.fold()
        return self.current

    def reserved(self) -> int:
        return self.allocated()  # the ledger keeps no cache: reserved is what is allocated

    # a ledger of tensor storages has no heap layout, so no fragmentation figure: readings say
    # None (absent), never 0.0 (which would read as "measured, not fragmented")

    def peak_since_reset(self) -> int:
        return self.peak  # deaths never raise the peak: nothing to fold

    def reset_peak(self) -> None:
        self.fold()
        self.peak = self.current

    def read_and_reset(self) -> Reading:
        self.fold()
        c = self.current
        p = self.peak
        self.peak = c
        return _new_reading(Reading, (c, c, p, self.allocations, self.frees, None, p))

    def stats(self) -> dict[str, float]:
        self.fold()
        return {"allocated_bytes": self.current, "allocated_peak_bytes": self.peak,
                "allocations": self.allocations, "frees": self.frees, "live_storages": len(self._live)}

    def reading(self) -> Reading:
        self.fold()
        c = self.current
        return Reading(c, c, self.peak, self.allocations, self.frees, None, self.peak)

    # -- deaths ------------------------------------------------------------------------------------
    def fold(self) -> None:
        """Take the queued deaths off the level (any thread; no lock taken when none is queued)."""
        if self._dead:
            with self._lock:
                self._fold_locked()

    def _fold_locked(self) -> None:
        # Peek, account, then pop: while a death is being accounted it is still queued, so code
        # that reads an empty queue without the lock (the per-op lookups) never meets a key of a
        # dead storage still in ``_live``. No call between the first change and the pop: a pending
        # signal is raised only at calls and loop jumps, so a Ctrl-C landing here leaves the death
        # wholly folded or still queued. A weakref the ledger no longer holds is just popped.
        dead = self._dead
        live = self._live
        while dead:
            ref = dead[0]
            k = ref.key
            if k in live and live[k] is ref:
                del live[k]
                self.current -= ref.nbytes
                self.frees += 1
            dead.popleft()

    # -- bookkeeping (the per-op work of LedgerMode, kept small: it runs for every aten op) ------
    def see(self, t: torch.Tensor) -> None:
        """Register a storage born before the forward that an op takes (before the op runs)."""
        if type(t) is _Parameter:
            return  # weights outlive every forward: registering them would only cost time
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, or no storage
            return
        if self._dead:  # a queued death may leave its id in _live, now carried by ``st``
            self.fold()
        if id(st) not in self._live and self._on_device(t):
            self._register(st, st.nbytes(), born=False)

    def observe_output(self, func: Any, t: torch.Tensor, fresh: bool) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, or no storage
            return
        if self._dead:  # a queued death may leave its id in _live, now carried by ``st``
            self.fold()
        known = self._live.get(id(st))
        if known is not None:
            # a known storage came back (view, in-place, out=): it may have been resized
            n = st.nbytes()
            if n != known.nbytes:
                grown = 0
                with self._lock:
                    self._fold_locked()  # deaths before growth: the peak must not count both
                    item = self._live.get(id(st))
                    if item is not None:
                        grown = n - item.nbytes
                        self._add(grown)
                        item.nbytes = n
                # growth is new memory this op allocated (resize_, out= into a smaller tensor): a
                # capture weighs it like a birth
                if grown > 0 and self.listener is not None:
                    self.listener(func, grown)
            return
        if not self._on_device(t):
            return
        n = st.nbytes()
        self._register(st, n, born=fresh)
        if fresh and self.listener is not None:
            self.listener(func, n)

    def see_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> None:
        """Register every input storage of an op not seen yet (``see`` for each tensor)."""
        for group in (args, kwargs.values() if kwargs else ()):
            for a in group:
                if isinstance(a, _Tensor):
                    self.see(a)
                elif type(a) is list or type(a) is tuple:
                    for t in a:
                        if isinstance(t, _Tensor):
                            self.see(t)

    def observe(self, func: Any, out: Any, fresh: tuple[bool, ...]) -> None:
        """Account an op's outputs: new storages are born (where ``fresh``, the op's schema flags,
        says so), known ones may have grown."""
        if isinstance(out, _Tensor):
            self.observe_output(func, out, fresh[0] if fresh else True)
        elif isinstance(out, (tuple, list)):
            for i, o in enumerate(out):
                f = fresh[i] if i < len(fresh) else True
                if isinstance(o, _Tensor):
                    self.observe_output(func, o, f)
                elif isinstance(o, (tuple, list)):  # Tensor[] returns (split, unbind, ...)
                    for t in o:
                        if isinstance(t, _Tensor):
                            self.observe_output(func, t, f)

    def _register(self, st: Any, n: int, born: bool) -> None:
        # keyed by the storage object's id: PyTorch keeps one Python object per live storage; a
        # dead one's key leaves _live when its queued death is folded, which every lookup does
        # first when the queue is not empty
        key = id(st)
        ref = _StorageRef(st, self._freed_cb)
        ref.key = key
        ref.nbytes = n
        ref.layer = self.layer if born else None
        with self._lock:
            # deaths queued before this birth come off first: alloc A, free A, alloc B must peak
            # at max(A, B), not A + B (checked here: a method call on every birth costs)
            if self._dead:
                self._fold_locked()
            if self.closed or key in self._live:
                return
            if born:
                # counted before the storage is held, and _add's only signal check is on entry:
                # a Ctrl-C never leaves a storage held whose bytes are not counted (its death
                # would then take off bytes never added)
                self._add(n)
                self.allocations += 1
            self._live[key] = ref

    def _add(self, n: int) -> None:
        self.current += n
        if self.current > self.peak:
            self.peak = self.current

    def close(self) -> None:
        """Stop tracking: fold the queued deaths and drop every weakref, so no callback outlives
        the forward. With a ``SurvivorTable`` attached, each storage born in the forward and still
        alive gets a new weakref that queues its death on the table instead (the forward's own
        weakrefs queue here, where nothing folds any more)."""
        with self._lock:
            self._fold_locked()
            self.closed = True
            live, self._live = self._live, {}
            self.listener = None   # a capture's observer: not kept alive by the survivors
        survivors = self.survivors
        if survivors is not None:
            # outside our lock. Called even with nothing to hand over: the table folds the deaths
            # queued since it was last read, so its queue never outgrows the storages it holds
            survivors.keep(_rehomed(live.values(), survivors.on_death), self.device_label)
        live.clear()
        self._dead.clear()  # deaths of our dropped weakrefs queued since the fold: nobody needs them


def _rehomed(refs: Any, on_death: Callable[[Any], None]) -> list[_StorageRef]:
    """New weakrefs, calling ``on_death``, on the storages of ``refs`` born in the forward and still
    alive (a weakref's callback is fixed at its creation)."""
    out = []
    for r in refs:
        if r.layer is None:
            continue  # born before the forward: not the forward's survivor
        st = r()
        if st is None:
            continue  # died since the fold: its death is in the closed ledger's queue
        ref = _StorageRef(st, on_death)
        ref.key = r.key
        ref.nbytes = r.nbytes
        ref.layer = r.layer
        out.append(ref)
    return out


# ops whose return aliases their input by schema but whose input is a tensor just built outside the
# dispatcher from Python data (torch.tensor): the storage is new to the forward
_LIFTS = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift.default}

# Per-op facts, keyed by id(OpOverload): hashing an OpOverload runs a Python __hash__, a dict keyed
# by it costs ~0.5 us a lookup on every op. The value holds the op, so its id is never reused.
# (op, C callable, fresh flags, whether inputs need registering)
_OpInfo = tuple[Any, Any, tuple[bool, ...], bool]
_INFO: dict[int, _OpInfo] = {}


def _op_info(func: Any) -> _OpInfo:
    fresh = _fresh_returns(func)
    # OpOverload.__call__ is a Python frame that calls ._op: call the C callable directly
    info = (func, getattr(func, "_op", func), fresh, func not in _LIFTS)
    _INFO[id(func)] = info
    return info


def _dispatch(mode: "LedgerMode", func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
    """The per-op work, written for speed: every aten op of an attributed forward runs through it.

    The common cases are inlined (a tensor input already known, a tensor output on a known storage
    of unchanged size); everything else goes through the ledger's methods.
    """
    info = _INFO.get(id(func))
    if info is None:
        info = _op_info(func)
    op = info[1]
    if mode.inert:
        return op(*args, **kwargs) if kwargs else op(*args)
    ledger = mode.ledger
    live = ledger._live
    # Deaths are queued (see TensorLedger): a storage freed since the last op may still have its
    # id in ``live`` while a new storage carries that id. A hit in ``live`` is trusted only when
    # the queue is empty just after the lookup (the storage object was in hand by then, so any
    # death that freed its id was queued before); otherwise the slow path folds and looks again.
    # The queue is folded first, as storages die between ops all the time.
    dead = ledger._dead
    try:
        if dead:
            ledger.fold()
        if info[3]:  # a lift's input is the new storage itself: seen as its output
            for a in args:
                if isinstance(a, _Tensor):
                    if type(a) is not _Parameter:
                        try:
                            if id(a.untyped_storage()) in live and not dead:
                                continue
                        except (RuntimeError, NotImplementedError):  # sparse, nested: no storage
                            continue
                        ledger.see(a)
                elif type(a) is list or type(a) is tuple:
                    for t in a:
                        if isinstance(t, _Tensor):
                            ledger.see(t)
            if kwargs:
                ledger.see_inputs((), kwargs)
    except Exception as e:  # telemetry must never break the op
        mode.error(e)
    out = op(*args, **kwargs) if kwargs else op(*args)
    try:
        if isinstance(out, _Tensor):
            try:
                st = out.untyped_storage()
                known = live.get(id(st))
                if known is not None and st.nbytes() == known.nbytes and not dead:
                    return out  # a view or in-place result on a storage we hold, same size
            except (RuntimeError, NotImplementedError):
                return out
            fresh = info[2]
            ledger.observe_output(func, out, fresh[0] if fresh else True)
        elif out is not None:
            ledger.observe(func, out, info[2])
    except Exception as e:
        mode.error(e)
    return out


class LedgerMode(TorchDispatchMode):
    """Routes every op's inputs and outputs into a ledger; the op itself runs unchanged.

    ``ignore_compile_internals``: inside a ``torch.compile``d region Dynamo would otherwise refuse
    to run compiled code while a user mode is on the stack and fall back to eager for good; with it,
    compiled code runs compiled and the ledger sees only the ops that code dispatches (see
    docs/design.md for what that means for figures).

    Dynamo must never trace our per-op code. PyTorch ensures that by wrapping every mode's
    ``__torch_dispatch__`` in a Dynamo-disable context (~0.7 us on every op, measured). We opt out
    of that wrapper and do the same thing only when a Dynamo frame callback is actually set: the
    method's code is on Dynamo's skip list, and under a callback it hands the op to a disabled copy
    of the body.
    """

    def __init__(self, ledger: TensorLedger, on_error: Callable[[BaseException], None] | None = None) -> None:
        super().__init__()
        self.ledger = ledger
        self.on_error = on_error
        self.inert = False  # set when its forward was abandoned: pass every op through untouched

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # we skip Dynamo ourselves, only when it is active (see the class docstring)

    def error(self, e: BaseException) -> None:
        if self.on_error is not None:
            self.on_error(e)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if _eval_frame_callback() is None:
            return _dispatch(self, func, args, kwargs)
        return _dispatch_untraced(self, func, args, kwargs)


_dispatch_untraced = DynamoDisabled(_dispatch)
_skip_code(LedgerMode.__torch_dispatch__.__code__)
