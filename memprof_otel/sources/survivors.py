"""Surviving bytes per layer: storages born during attributed forwards that are still alive.

The tensor ledger (``ledger.py``) holds one weakref per storage it sees, carrying the storage's
bytes; a storage born during the forward also carries the layer that was innermost when it was
born. When the forward ends the ledger hands the weakrefs of its born storages that are still
alive to this table instead of dropping them: the same objects, no new ones. Each weakref's
callback (the ledger's) then reports the storage's death here, whenever and in whatever thread it
happens, and the table takes its bytes off its birth layer.

So ``surviving()`` is, per (layer, device), the bytes of storages born during attributed forwards
that still live now. A KV cache replaced at every ``generate()`` shows a sawtooth; a module that
keeps its outputs in a list, a staircase. Forwards that are not attributed are not seen: with a
sampling scheduler the figure is a sample (docs/reference.md, "Leaks").

Bounded: at most ``capacity`` storages are held. Past that, newly surviving storages are not held
(counted in ``untracked``) and the figure is a lower bound until some held storage dies. Costs
nothing while no forward is attributed: the only work is in the ledger's close and in the
callbacks of the held storages' deaths.

No torch here: the table only sees weakrefs with ``nbytes`` and ``layer`` attributes.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

Key = tuple[str, str]  # (layer label, device)


class SurvivorTable:
    """Thread-safe. ``keep`` at the end of a forward, ``release`` from a weakref callback."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # re-entrant: a garbage collection inside ``keep`` may free a held storage on this very
        # thread, and its callback calls ``release``
        self._lock = threading.RLock()
        self._held: dict[int, Any] = {}        # id(weakref) -> the weakref (keeps its callback armed)
        self._bytes: dict[Key, int] = {}       # (layer, device) -> surviving bytes
        self._count: dict[Key, int] = {}       # (layer, device) -> surviving storages
        self._keys: dict[Key, Key] = {}        # interned keys, so a held weakref shares its key
        self.untracked = 0                     # storages that survived while the table was full
        self.untracked_bytes = 0

    def keep(self, refs: Iterable[Any], device: str) -> None:
        """Hold the weakrefs of storages that outlived their forward (``ref.layer`` is the birth
        layer's label; a ref whose storage is already gone is skipped)."""
        with self._lock:
            held = self._held
            for ref in refs:
                if ref() is None:
                    continue  # died between the forward's end and now: its callback found nothing
                if len(held) >= self.capacity:
                    self.untracked += 1
                    self.untracked_bytes += ref.nbytes
                    continue
                k = (ref.layer, device)
                key = self._keys.get(k)
                if key is None:
                    key = self._keys[k] = k
                ref.layer = key  # from now on the weakref names its bucket
                held[id(ref)] = ref
                self._bytes[key] = self._bytes.get(key, 0) + ref.nbytes
                self._count[key] = self._count.get(key, 0) + 1
                # it may have died since the check above (a collection run by an allocation here,
                # on this thread): whoever pops it, this or its callback's release, takes it off
                if ref() is None and held.pop(id(ref), None) is ref:
                    self._bytes[key] -= ref.nbytes
                    self._count[key] -= 1

    def release(self, ref: Any) -> None:
        """A storage died: if held, its bytes leave its birth layer."""
        with self._lock:
            if self._held.pop(id(ref), None) is ref:
                key = ref.layer
                self._bytes[key] -= ref.nbytes
                self._count[key] -= 1

    def surviving(self) -> dict[Key, tuple[int, int]]:
        """(layer, device) -> (bytes, storages), for every key that ever held a survivor."""
        with self._lock:
            return {k: (b, self._count[k]) for k, b in self._bytes.items()}

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def counts(self) -> dict[str, int]:
        """Storages held, the most that may be, and those left out because the table was full."""
        with self._lock:
            return {"held": len(self._held), "capacity": self.capacity, "untracked_storages": self.untracked,
                    "untracked_bytes": self.untracked_bytes}

    def clear(self) -> None:
        """Forget every survivor (their weakrefs die with the table's references: no callbacks)."""
        with self._lock:
            self._held.clear()
            self._bytes.clear()
            self._count.clear()
            self.untracked = 0
            self.untracked_bytes = 0
