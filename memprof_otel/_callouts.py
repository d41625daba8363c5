"""The places where memprof-otel's code calls the application's: what a heap diff must not call ours.

A heap diff leaves out memprof-otel's own allocations: those made by its threads, its hooks and its
buffers, directly or through a library (the sampler waiting on a ``threading.Event``, the OTel SDK
building a span). It tells them apart by walking each traceback from the allocating frame towards
the older ones, past library frames, to the first frame that is ours or the application's. When
that frame of ours is a call into the application — an ``operation`` decorator's wrapper, a user's
``shape_of``, an alert callback, a compiled model's call — what was allocated below it is the
application's, and the diff keeps it. This module only records those functions; the walk is in
``dumps/heap_diff.py``.
"""
from __future__ import annotations

from types import CodeType
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_CODES: set[CodeType] = set()


def calls_application(fn: F) -> F:
    """Mark ``fn`` (and every function defined inside it, e.g. a decorator's wrapper) as calling
    application code. Returns ``fn`` unchanged: no wrapper, no cost on the call."""
    todo = [fn.__code__]
    while todo:
        code = todo.pop()
        _CODES.add(code)
        todo.extend(c for c in code.co_consts if isinstance(c, CodeType))
    return fn


def callout_lines() -> frozenset[tuple[str, int]]:
    """``(file, line)`` of every line of the marked functions, as tracebacks name them."""
    return frozenset((code.co_filename, line) for code in list(_CODES)
                     for _, _, line in code.co_lines() if line is not None)


__all__ = ["calls_application", "callout_lines"]
