"""The public API's functions and ``operation``: the only modules besides the composition root
(``runtime.py``) that look up the process runtime. Everything below receives what it needs."""
from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import os
import time
from typing import Any, Callable, Iterable, TypeVar

from ._callouts import calls_application
from .attribution.frameworks import adapter_for
from .attribution.instrumentation import Instrumentation
from .config import Config
from .errors import MemprofError
from .http import server as _http
from .reports.plot import plot_timeline
from .reports.text import format_report
from .runtime import runtime
from .telemetry.operations import reset_current, set_current
from .timeline import OperationRecord, Timeline
from .watchdog.service import AlertCallback

F = TypeVar("F", bound=Callable[..., Any])


def instrument(model: Any, name: str | None = None, config: Any = None,
               shape_of: Callable[[tuple, dict], dict[str, int]] | None = None,
               **overrides: Any) -> Instrumentation:
    """Attach memprof_otel to ``model``; returns the handle (also a context manager).

    ``shape_of(args, kwargs) -> {"batch": .., "seq_len": ..}``: the input-shape features the memory
    model fits each forward's peak on, for models whose inputs the default does not read (it takes
    batch and sequence length of the token tensor and a KV cache's length)."""
    attach = adapter_for(model)  # before the runtime starts: a wrong model changes nothing
    rt = runtime()
    # a config given to start_monitoring() is the process's: models instrumented later use it (not
    # one adopted from an earlier instrument() call, whose overrides belong to that model)
    if config is None:
        config = rt.monitoring_config
    if not (isinstance(config, Config) and not overrides):
        # the caller's config and kwargs strict; a bad MEMPROF_OTEL_* never stops the model
        config = rt.resolve_config(config, **overrides)
    h = attach(model, name, config, shape_of)
    rt.connect(h)
    return h


def start_monitoring(config: Any = None, *, meter_provider: Any = None, tracer_provider: Any = None) -> None:
    """Start (or restart with this config) the background sampler and exporters; no model needed.
    ``meter_provider``/``tracer_provider``: OTel SDK providers to use instead of our own."""
    runtime().start_monitoring(config, meter_provider=meter_provider, tracer_provider=tracer_provider)


def stop_monitoring(timeout: float = 2.0) -> bool:
    """Stop the sampler (joined within ``timeout``); instrumented models keep their hooks, and what
    was sampled stays: ``timeline()``, ``report()``, ``plot()`` and ``export_timeline()`` still show
    it. A ``start_monitoring()`` with the same settings continues that history; with other settings
    it starts a new one."""
    return runtime().stop_monitoring(timeout)


def shutdown(timeout: float = 5.0) -> bool:
    """Flush exporters, stop the sampler and servers, within ``timeout`` seconds (also at exit)."""
    return runtime().shutdown(timeout)


def mark_operation(name: str, **attributes: Any) -> OperationRecord:
    """Start a process-wide phase named ``name``; the previous phase ends here."""
    if not isinstance(name, str) or not name:
        raise MemprofError(f"operation name must be a non-empty string, got {name!r}")
    return runtime().operations_tracker().mark(name, dict(attributes))


def end_phase() -> None:
    """End the current ``mark_operation`` phase without starting another."""
    runtime().tracker.end_phase()


def timeline(since: float | None = None) -> Timeline:
    """Synchronized arrays (timestamps, RSS, CPU, I/O, allocator bytes per device) + operations.
    ``since``: seconds back from now (None = everything in the ring buffer)."""
    rt = runtime()
    since_unix = None if since is None else time.time() - since
    return Timeline.from_samples(rt.samples(since_unix), rt.tracker.records(since_unix))


def report() -> str:
    """The operations report: peak RSS, when, during which operation; a numbered timeline."""
    rt = runtime()
    return format_report(rt.samples(), rt.tracker.records())


def plot(path: str | os.PathLike[str]) -> None:
    """Write the 4-panel PNG (memory with phases, CPU, disk I/O per phase, durations)."""
    plot_timeline(timeline(), path)


def serve(host: str | None = None, port: int | None = None, token: str | None = None) -> _http.Server:
    """Start the endpoint on its own threads; defaults from config ``http`` (127.0.0.1:9464)."""
    return _http.serve(runtime(), host, port, token)


def wsgi_app(token: str | None = None, *, bind_host: str | None = None) -> Callable[..., Iterable[bytes]]:
    """The endpoint as a WSGI application (mount it in gunicorn, Flask, Django...)."""
    return _http.wsgi_app(runtime(), token, bind_host=bind_host)


def asgi_app(token: str | None = None, *, bind_host: str | None = None) -> Callable[..., Any]:
    """The endpoint as an ASGI application (mount it in FastAPI/Starlette: ``app.mount("/memprof", ...)``).
    Handlers run in a worker thread: a dump waiting for forwards never blocks the event loop."""
    return _http.asgi_app(runtime(), token, bind_host=bind_host)


def add_alert_callback(fn: AlertCallback) -> None:
    """Call ``fn(alert_dict)`` when a rule with the ``callback`` action starts firing."""
    runtime().alert_callbacks.append(fn)


def remove_alert_callback(fn: AlertCallback) -> None:
    try:
        runtime().alert_callbacks.remove(fn)
    except ValueError:
        pass


class operation:
    """``with operation("generate", model="gpt2"):`` / ``@operation("embed")`` (sync or async).

    Opens an OTel span (attributes ``memprof.memory.peak_bytes``, ``memprof.memory.delta_bytes``),
    records duration, peak and delta. Telemetry failures are counted, never raised; the body's
    own exception propagates unchanged.
    """

    def __init__(self, name: str, **attributes: Any) -> None:
        if not isinstance(name, str) or not name:
            raise MemprofError(f"operation name must be a non-empty string, got {name!r}")
        self.name = name
        self.attributes = attributes
        # per context, so one operation object shared by threads or tasks closes the right record
        self._stacks: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
            f"memprof_operation_stack_{id(self)}", default=())

    def __enter__(self) -> OperationRecord | None:
        tracker = runtime().operations_tracker()
        if tracker is None:
            return None
        rec = tracker.begin(self.name, dict(self.attributes))
        span = token = None
        if tracker.spans is not None:
            try:
                span = tracker.spans.start(rec)
                token = tracker.spans.activate(span)
            except Exception as e:
                tracker.count_error("span-start", e)
        entry = [rec, set_current(rec), span, token, None]
        # the token lets __exit__ take the variable out of the context again: a context keeps every
        # variable ever set in it, and each operation object has its own (~170 B per operation)
        entry[4] = self._stacks.set(self._stacks.get() + (entry,))
        return rec

    def __exit__(self, et: Any, exc: BaseException | None, tb: Any) -> None:
        stack = self._stacks.get()
        if not stack:
            return
        rec, ctx_token, span, token, stack_token = stack[-1]
        try:
            self._stacks.reset(stack_token)  # back to unset when this was the outermost entry
        except (ValueError, RuntimeError):  # exited in another context or out of order
            self._stacks.set(stack[:-1])
        tracker = runtime().operations_tracker()
        reset_current(ctx_token)
        if tracker is None:
            return
        tracker.end(rec, exc)
        if tracker.spans is not None and span is not None:
            try:
                tracker.spans.end(span, rec, exc)
                if token is not None:
                    tracker.spans.deactivate(token)
            except Exception as e:
                tracker.count_error("span-end", e)

    async def __aenter__(self) -> OperationRecord | None:
        return self.__enter__()

    async def __aexit__(self, et: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(et, exc, tb)

    @calls_application
    def __call__(self, fn: F) -> F:
        name, attrs = self.name, self.attributes
        # a generator's body runs while it is iterated, not when it is called: the operation spans
        # the iteration (a streamed response, token by token), from the first item to the last
        if inspect.isasyncgenfunction(fn):
            @functools.wraps(fn)
            async def agen_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with operation(name, **attrs):
                    async for item in fn(*args, **kwargs):
                        yield item
            return agen_wrapper  # type: ignore[return-value]
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
                with operation(name, **attrs):
                    return (yield from fn(*args, **kwargs))
            return gen_wrapper  # type: ignore[return-value]
        if asyncio.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                async with operation(name, **attrs):
                    return await fn(*args, **kwargs)
            return awrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with operation(name, **attrs):
                return fn(*args, **kwargs)
        return wrapper  # type: ignore[return-value]


__all__ = ["Config", "add_alert_callback", "asgi_app", "end_phase", "instrument", "mark_operation", "operation",
           "plot", "remove_alert_callback", "report", "serve", "shutdown", "start_monitoring", "stop_monitoring",
           "timeline", "wsgi_app"]
