"""The models instrumented now, by name (what exporters, the endpoint and the dump service read)
and by model object (what refuses instrumenting one model twice, whatever its framework).

One lock guards the tables and the short sections that must not interleave with a registration
(a handle's capture slot); names are the ``model`` label, unique per process.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Callable, TypeVar

from ..errors import AlreadyInstrumented, InstrumentationError
from .handle import ModelHandle

H = TypeVar("H", bound=ModelHandle)

LOCK = threading.Lock()
_LIVE: dict[str, ModelHandle] = {}
# model object -> its live handle; weak: a model dropped by its owner leaves the table
_BY_MODEL: "weakref.WeakKeyDictionary[Any, ModelHandle]" = weakref.WeakKeyDictionary()


def live_handles() -> dict[str, ModelHandle]:
    """Name -> handle of every model instrumented now (a copy)."""
    with LOCK:
        return dict(_LIVE)


def register(model: Any, name: str | None, default: str, make: Callable[[str], H]) -> H:
    """Build ``model``'s handle with ``make(name)`` under the lock and record it. ``name`` None:
    ``default``, then ``default-2``, ``default-3``... whichever is free; a name in use:
    InstrumentationError; a model instrumented already: AlreadyInstrumented."""
    with LOCK:
        existing = _BY_MODEL.get(model)
        if existing is not None:
            raise AlreadyInstrumented(f"this {type(model).__name__} is already instrumented as "
                                      f"{existing.name!r}; call uninstrument() on that handle first")
        if name is None:
            name = next(n for n in (default if i == 0 else f"{default}-{i + 1}" for i in itertools.count())
                        if n not in _LIVE)
        elif name in _LIVE:
            raise InstrumentationError(f"a model named {name!r} is already instrumented; names are "
                                       "the 'model' label and must be unique per process")
        h = make(name)
        _LIVE[name] = h
        _BY_MODEL[model] = h
    return h


def unregister(h: ModelHandle) -> None:
    """Forget ``h`` (idempotent; a newer handle under the same name or of the same model stays)."""
    model = h.model
    with LOCK:
        if _LIVE.get(h.name) is h:
            del _LIVE[h.name]
        if model is not None and _BY_MODEL.get(model) is h:
            del _BY_MODEL[model]


__all__ = ["LOCK", "live_handles", "register", "unregister"]
