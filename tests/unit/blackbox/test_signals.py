"""Stop signals a process handled are noted before the handler runs, whoever installed the
handler and whenever; code that saves, restores or compares handlers sees its own; a signal nobody
handles is left to its default action. The references: the signals this test sends to its own
process (``os.kill``) and the handlers it installs."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from memprof_otel.blackbox import signals

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")


@pytest.fixture
def noted():
    got: list[int] = []
    saved = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGTERM)}
    signals.install(got.append)
    yield got
    signals.stop_noting()
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_handler_installed_after_the_library_runs_behind_the_note(noted):
    calls: list[int] = []

    def server_handler(signum, frame):  # what uvicorn's handle_exit is to the process
        calls.append(signum)

    # GIVEN a server that installs its handler after the library started (uvicorn's serve())
    previous = signal.signal(signal.SIGHUP, server_handler)
    # THEN what it gets back and what it reads is its own, never the wrapper
    assert signal.getsignal(signal.SIGHUP) is server_handler
    assert not isinstance(previous, signals.NotedHandler)
    # WHEN the signal arrives
    os.kill(os.getpid(), signal.SIGHUP)
    # THEN it was noted, and the server's handler ran
    assert noted == [signal.SIGHUP] and calls == [signal.SIGHUP]
    # AND restoring what it saved (uvicorn's exit) restores the original, noted again on the next signal
    assert signal.signal(signal.SIGHUP, previous) is server_handler


def test_a_handler_in_place_before_the_library_started_is_noted_too():
    got: list[int] = []
    calls: list[int] = []
    saved = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, lambda s, f: calls.append(s))
        signals.install(got.append)  # on the main thread: the handler in place is wrapped
        os.kill(os.getpid(), signal.SIGHUP)
        assert got == [signal.SIGHUP] and calls == [signal.SIGHUP]
    finally:
        signals.stop_noting()
        signal.signal(signal.SIGHUP, saved)


def test_the_default_action_and_other_signals_are_left_alone(noted):
    # SIG_DFL / SIG_IGN go in as they are: a stop signal nobody handles still ends the process at
    # once, and is not a graceful stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGTERM)
    assert noted == []
    # a signal that is not a stop signal is never wrapped
    saved = signal.getsignal(signal.SIGUSR1)
    try:
        def h(s, f):
            return None
        signal.signal(signal.SIGUSR1, h)
        assert signal.getsignal(signal.SIGUSR1) is h
        os.kill(os.getpid(), signal.SIGUSR1)
        assert noted == []
    finally:
        signal.signal(signal.SIGUSR1, saved)


def test_a_note_that_fails_never_stops_the_servers_handler():
    calls: list[int] = []
    saved = signal.getsignal(signal.SIGHUP)

    def broken(signum: int) -> None:
        raise RuntimeError("the black box is gone")
    try:
        signals.install(broken)
        signal.signal(signal.SIGHUP, lambda s, f: calls.append(s))
        os.kill(os.getpid(), signal.SIGHUP)
        assert calls == [signal.SIGHUP]
    finally:
        signals.stop_noting()
        signal.signal(signal.SIGHUP, saved)


def test_install_off_the_main_thread_patches_but_cannot_wrap_what_is_in_place():
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append(signals.install(lambda s: None)))
    t.start()
    t.join()
    signals.stop_noting()
    assert out == [False]
    # installing from another thread is refused by Python itself, as without the library
    with pytest.raises(ValueError):
        err: list[BaseException] = []

        def set_it() -> None:
            try:
                signal.signal(signal.SIGHUP, signal.SIG_DFL)
            except BaseException as e:
                err.append(e)
        t = threading.Thread(target=set_it)
        t.start()
        t.join()
        raise err[0]


def test_a_noted_stop_signals_handler_set_again_is_told_as_the_end_of_the_shutdown():
    got: list[int] = []
    restored: list[int] = []
    saved = signal.getsignal(signal.SIGHUP)
    try:
        signals.install(got.append, restored.append)
        original = signal.signal(signal.SIGHUP, lambda s, f: None)   # what uvicorn's serve() does
        signal.signal(signal.SIGHUP, lambda s, f: None)             # set again before any signal: nothing
        assert restored == []
        os.kill(os.getpid(), signal.SIGHUP)
        signal.signal(signal.SIGHUP, original)                      # its exit restores what it found
        assert got == [signal.SIGHUP] and restored == [signal.SIGHUP]
    finally:
        signals.stop_noting()
        signal.signal(signal.SIGHUP, saved)


def test_the_wrapped_functions_keep_their_names_and_errors():
    signals.install(lambda s: None)
    signals.stop_noting()
    assert signal.signal.__name__ == "signal" and signal.getsignal.__name__ == "getsignal"
    with pytest.raises(TypeError):
        signal.signal("x", signal.SIG_DFL)
