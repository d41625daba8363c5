"""Surviving bytes per layer: storages born during attributed forwards that are still alive.

The tensor ledger (``ledger.py``) holds one weakref per storage it sees, carrying the storage's
bytes; a storage born during the forward also carries the layer that was innermost when it was
born. When the forward ends the ledger gives each of its born storages that is still alive a new
weakref whose callback is this table's ``on_death`` (a deque's bound ``append``: C code, so a
Ctrl-C arriving during the free is never raised inside a callback and lost) and hands them here.
The queued deaths are folded in, taking their bytes off their birth layers, whenever the table is
read and whenever a forward hands over survivors.

So ``surviving()`` is, per (layer, device), the bytes of storages born during attributed forwards
that still live now. A KV cache replaced at every ``generate()`` shows a sawtooth; a module that
keeps its outputs in a list, a staircase. Forwards that are not attributed are not seen: with a
sampling scheduler the figure is a sample (docs/reference.md, "Leaks").

Bounded: at most ``capacity`` storages are held. Past that, newly surviving storages are not held
(counted in ``untracked``) and the figure is a lower bound until some held storage dies. The death
queue is bounded by the same number: only held weakrefs have this table's callback, each queues
once, and it is folded at every attributed forward's end, so dead storages never crowd live ones
out of the table for long. Costs nothing while no forward is attributed: the only work is in the
ledger's close, in the reads, and one append per held storage's death.

No torch here: the table only sees weakrefs with ``nbytes`` and ``layer`` attributes.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

Key = tuple[str, str]  # (layer label, device)


class SurvivorTable:
    """Thread-safe. ``keep`` at the end of a forward; ``on_death`` is the held weakrefs' callback."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # re-entrant: a finalizer run by a garbage collection inside ``keep`` may end an
        # abandoned forward on this very thread, whose ledger hands its survivors over here
        self._lock = threading.RLock()
        self._held: dict[int, Any] = {}        # id(weakref) -> the weakref (keeps its callback armed)
        self._bytes: dict[Key, int] = {}       # (layer, device) -> surviving bytes
        self._count: dict[Key, int] = {}       # (layer, device) -> surviving storages
        self._keys: dict[Key, Key] = {}        # interned keys, so a held weakref shares its key
        self.untracked = 0                     # storages that survived while the table was full
        self.untracked_bytes = 0
        # weakrefs of held storages that died, appended in whatever thread freed them (append and
        # popleft are atomic), taken off by ``_fold`` under the lock
        self._dead: deque[Any] = deque()
        self.on_death: Callable[[Any], None] = self._dead.append

    def keep(self, refs: Iterable[Any], device: str) -> None:
        """Hold the weakrefs of storages that outlived their forward (``ref.layer`` is the birth
        layer's label; their callback must be ``on_death``). Folds the deaths queued so far, so
        room freed by dead storages is free before the new ones are counted."""
        with self._lock:
            self._fold()
            held = self._held
            for ref in refs:
                if ref() is None:
                    continue  # already dead: its queued death finds nothing held and is dropped
                if len(held) >= self.capacity:
                    self.untracked += 1
                    self.untracked_bytes += ref.nbytes
                    continue
                k = (ref.layer, device)
                key = self._keys.get(k)
                if key is None:
                    key = self._keys[k] = k
                i = id(ref)
                b = self._bytes.get(key, 0)
                c = self._count.get(key, 0)
                # no call from here to the next weakref: a Ctrl-C (raised only at calls and loop
                # jumps) never leaves a weakref held whose bytes are not counted
                ref.layer = key  # from now on the weakref names its bucket
                held[i] = ref
                self._bytes[key] = b + ref.nbytes
                self._count[key] = c + 1
            self._fold()  # deaths since the check above (a collection run by an allocation here)

    def _fold(self) -> None:
        """Take the queued deaths' bytes off their birth layers (the caller holds the lock)."""
        # Peek, account, then pop, with no call between the first change and the pop: a pending
        # signal is raised only at calls and loop jumps, so a Ctrl-C landing here leaves the death
        # either wholly folded or still queued, never taken off the queue with its bytes still held.
        dead = self._dead
        held = self._held
        while dead:
            ref = dead[0]
            i = id(ref)
            if i in held and held[i] is ref:
                del held[i]
                key = ref.layer
                self._bytes[key] -= ref.nbytes
                self._count[key] -= 1
            dead.popleft()

    def surviving(self) -> dict[Key, tuple[int, int]]:
        """(layer, device) -> (bytes, storages), for every key that ever held a survivor."""
        with self._lock:
            self._fold()
            return {k: (b, self._count[k]) for k, b in self._bytes.items()}

    def held(self) -> int:
        with self._lock:
            self._fold()
            return len(self._held)

    def counts(self) -> dict[str, int]:
        """Storages held, the most that may be, and those left out because the table was full."""
        with self._lock:
            self._fold()
            return {"held": len(self._held), "capacity": self.capacity, "untracked_storages": self.untracked,
                    "untracked_bytes": self.untracked_bytes}

    def clear(self) -> None:
        """Forget every survivor (their weakrefs die with the table's references: no callbacks)."""
        with self._lock:
            self._held.clear()
            self._dead.clear()
            self._bytes.clear()
            self._count.clear()
            self.untracked = 0
            self.untracked_bytes = 0
