"""The models instrumented now, by name: what exporters, the endpoint and the dump service read.

One lock guards the table and the short sections that must not interleave with a registration
(a handle's capture slot); names are the ``model`` label, unique per process.
"""
from __future__ import annotations

import itertools
import threading
from typing import Callable, TypeVar

from ..errors import InstrumentationError
from .handle import ModelHandle

H = TypeVar("H", bound=ModelHandle)

LOCK = threading.Lock()
_LIVE: dict[str, ModelHandle] = {}


def live_handles() -> dict[str, ModelHandle]:
    """Name -> handle of every model instrumented now (a copy)."""
    with LOCK:
        return dict(_LIVE)


def register(name: str | None, default: str, make: Callable[[str], H]) -> H:
    """Build a handle with ``make(name)`` under the lock and record it. ``name`` None: ``default``,
    then ``default-2``, ``default-3``... whichever is free; a name in use: InstrumentationError."""
    with LOCK:
        if name is None:
            name = next(n for n in (default if i == 0 else f"{default}-{i + 1}" for i in itertools.count())
                        if n not in _LIVE)
        elif name in _LIVE:
            raise InstrumentationError(f"a model named {name!r} is already instrumented; names are "
                                       "the 'model' label and must be unique per process")
        h = make(name)
        _LIVE[name] = h
    return h


def unregister(h: ModelHandle) -> None:
    """Forget ``h`` (idempotent; a newer handle under the same name stays)."""
    with LOCK:
        if _LIVE.get(h.name) is h:
            del _LIVE[h.name]


__all__ = ["LOCK", "live_handles", "register", "unregister"]
