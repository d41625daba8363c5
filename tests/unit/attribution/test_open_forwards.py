"""OpenForwards: a forward runs alone only if no other thread's forward is open; a thread that ended
with a forward open (interrupted, abandoned) does not count for ever after."""
from __future__ import annotations

import threading

from memprof_otel.attribution.open_forwards import OpenForwards


def _in_thread(fn) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join(10)
    assert not t.is_alive()


def test_a_forward_alone_ran_alone() -> None:
    o = OpenForwards()
    n = o.open()
    assert not o.another_thread_open()
    o.close()
    assert o.ran_alone(n)


def test_a_forward_open_in_a_live_thread_overlaps() -> None:
    o = OpenForwards()
    opened, release = threading.Event(), threading.Event()

    def other() -> None:
        o.open()
        opened.set()
        release.wait(10)
        o.close()

    t = threading.Thread(target=other)
    t.start()
    assert opened.wait(10)
    n = o.open()
    assert o.another_thread_open()
    o.close()
    assert not o.ran_alone(n)
    release.set()
    t.join(10)
    n = o.open()
    o.close()
    assert o.ran_alone(n)


def test_a_thread_that_ended_with_a_forward_open_is_forgotten() -> None:
    o = OpenForwards()
    _in_thread(o.open)  # opened, never closed: a KeyboardInterrupt runs no closing hook
    n = o.open()
    assert not o.another_thread_open()
    o.close()
    assert o.ran_alone(n)


def test_nested_forwards_of_one_thread_count_until_the_outer_closes() -> None:
    o = OpenForwards()
    outer = o.open()
    inner = o.open()
    o.close()
    assert not o.ran_alone(inner)  # the outer one is still open on this thread
    o.close()
    assert not o.ran_alone(outer)  # another forward (the inner) opened after it
    n = o.open()
    o.close()
    assert o.ran_alone(n)


def test_a_new_thread_reusing_an_ended_threads_ident_starts_from_none_open() -> None:
    o = OpenForwards()
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()

    def reuse() -> None:
        # an entry left under this ident by a thread that ended: not this thread's
        o._threads[threading.get_ident()] = (ended, 1)
        n = o.open()
        o.close()
        assert o.ran_alone(n)

    _in_thread(reuse)
