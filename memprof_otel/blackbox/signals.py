"""Which stop signal this process handled: the evidence that tells a graceful stop from a kill.

A server stops gracefully on SIGTERM (Kubernetes, docker, systemd), SIGINT, SIGQUIT or SIGHUP
through a Python handler of its own, and may then die of the signal anyway: uvicorn restores the
handlers it found and re-raises the signal (``signal.raise_signal``), so a process it stopped
cleanly ends by the signal's default action, with no ``atexit`` hook run. Nothing left in the
process can tell the next one "this was a graceful stop" unless it is noted when the handler
runs.

Python has no hook for "a signal arrived": a handler replaces the one before it, and servers
install theirs after the application imported this library (uvicorn inside its ``serve()``,
gunicorn's workers after the fork). So ``signal.signal`` itself is wrapped, once per process:
every Python handler installed for a stop signal, before or after, runs behind a note of the
signal (an attribute store and a copy into the black box's mapping), then as it would have.
``signal.signal`` and ``signal.getsignal`` return the handler the caller installed, never the
wrapper, so code that saves and restores handlers, or compares them, sees what it expects.
``SIG_DFL`` and ``SIG_IGN`` are installed as they are: a process whose stop signal nobody
handles dies at once, as without this library, and is not called a graceful stop.

A handled signal alone does not make a graceful stop: a handler may only log, or reopen log files
(SIGHUP), and the server keeps serving. What ends a graceful stop is the server's shutdown, and the
servers that die of the signal afterwards set a handler of that signal again first (uvicorn restores
the handlers it found, then re-raises): a stop signal's handler set after that signal was noted is
told too (``restored``), and only both together are a graceful stop (``classify.py``).
"""
from __future__ import annotations

import functools
import signal
import threading
from typing import Any, Callable

STOP_SIGNALS: tuple[int, ...] = tuple(
    s for s in (getattr(signal, n, None) for n in ("SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP")) if s is not None)

_lock = threading.Lock()
_note: Callable[[int], None] | None = None
_restored: Callable[[int], None] | None = None
_noted: set[int] = set()  # the stop signals a handler ran for
_real_signal: Callable[..., Any] | None = None
_real_getsignal: Callable[..., Any] | None = None


class NotedHandler:
    """A stop signal's Python handler, behind the note that it ran."""

    __slots__ = ("handler",)

    def __init__(self, handler: Callable[..., Any]) -> None:
        self.handler = handler

    def __call__(self, signum: int, frame: Any) -> Any:
        _noted.add(signum)
        note = _note
        if note is not None:
            try:
                note(signum)
            except Exception:  # the note is an extra: the server's handler runs whatever happens
                pass
        return self.handler(signum, frame)

    def __repr__(self) -> str:
        return f"NotedHandler({self.handler!r})"


def _unwrap(h: Any) -> Any:
    return h.handler if isinstance(h, NotedHandler) else h


def _wrap(signum: int, h: Any) -> Any:
    if signum in STOP_SIGNALS and callable(h) and not isinstance(h, NotedHandler):
        return NotedHandler(h)
    return h


def _signal(signalnum: Any, handler: Any) -> Any:
    assert _real_signal is not None
    if not isinstance(signalnum, int):  # the real call raises what it always raised
        return _unwrap(_real_signal(signalnum, handler))
    previous = _unwrap(_real_signal(signalnum, _wrap(signalnum, handler)))
    after = _restored
    if signalnum in _noted and after is not None:
        try:
            after(signalnum)
        except Exception:  # the note is an extra: the caller's handler is set whatever happens
            pass
    return previous


def _getsignal(signalnum: Any) -> Any:
    assert _real_getsignal is not None
    return _unwrap(_real_getsignal(signalnum))


def install(note: Callable[[int], None], restored: Callable[[int], None] | None = None) -> bool:
    """Note every handled stop signal with ``note(signum)`` from now on, and a handler of a noted
    stop signal set again with ``restored(signum)`` (the latest callbacks win). The handlers in place
    now are wrapped where this runs on the main thread (the only one that may set them); True when
    they were."""
    global _note, _restored, _real_signal, _real_getsignal
    with _lock:
        _note, _restored = note, restored
        if _real_signal is None:
            _real_signal, _real_getsignal = signal.signal, signal.getsignal
            functools.update_wrapper(_signal, _real_signal)
            functools.update_wrapper(_getsignal, _real_getsignal)
            signal.signal, signal.getsignal = _signal, _getsignal  # type: ignore[assignment]
    if threading.current_thread() is not threading.main_thread():
        return False
    for s in STOP_SIGNALS:
        try:
            current = _real_getsignal(s)
            if callable(current) and not isinstance(current, NotedHandler):
                _real_signal(s, NotedHandler(current))
        except (OSError, ValueError, RuntimeError):  # not settable here (an embedded interpreter)
            pass
    return True


def stop_noting() -> None:
    """No more notes (the handlers stay wrapped: unwrapping them would race the server's own)."""
    global _note, _restored
    _note = _restored = None
    _noted.clear()


def name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
