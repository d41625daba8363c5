"""The finalizer that closes a forward a BaseException abandoned runs wherever the garbage collector
frees the forward's args, in the middle of any later forward: a Ctrl-C whose handler runs inside it
must still reach the caller, not be dropped with the finalizer's exception."""
from __future__ import annotations

import gc
import signal
import time
from typing import Any

import pytest

from memprof_otel.attribution.torch.root_hooks import ReleaseWatch


class _Owner:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.released = 0

    def _args_released(self, ident: int, state: Any) -> None:
        self.released += 1
        raise self.exc


def _spin(seconds: float = 2.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # bytecode boundaries, where a pending Python signal handler runs
        time.sleep(0.001)


@pytest.fixture
def ctrl_c_raises():
    """SIGINT handled as Python handles it in a foreground program (KeyboardInterrupt). A process
    started in the background of a non-interactive shell (``cmd &`` in a script) inherits SIGINT
    ignored, and then ``_thread.interrupt_main`` does nothing: the whole suite run that way failed
    this test every time."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_inside_the_finalizer_is_raised_again_in_the_caller(ctrl_c_raises) -> None:
    owner = _Owner(KeyboardInterrupt())
    watch = ReleaseWatch(owner, 1, None)  # type: ignore[arg-type]
    # No collection while the Ctrl-C is on its way: a collection that runs some other object's
    # finalizer when the handler is due has the handler raise inside that finalizer, where CPython
    # drops it (any finalizer's Ctrl-C, not ours to catch: reproduced with slow cyclic finalizers)
    gc.collect()
    gc.disable()
    try:
        # WHEN the finalizer's call raises KeyboardInterrupt (the SIGINT handler ran inside it);
        # `del` frees the watch at once (its refcount), the finalizer runs there
        with pytest.raises(KeyboardInterrupt):
            del watch
            _spin()
    finally:
        gc.enable()
    # THEN the caller got it, after the finalizer had run
    assert owner.released == 1


def test_any_other_error_inside_the_finalizer_stays_there() -> None:
    owner = _Owner(RuntimeError("a handle torn down"))
    watch = ReleaseWatch(owner, 1, None)  # type: ignore[arg-type]
    del watch
    _spin(0.2)  # no KeyboardInterrupt comes
    assert owner.released == 1
