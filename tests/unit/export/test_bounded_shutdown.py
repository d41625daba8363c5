"""Our providers' shutdown ends at its deadline whatever the steps do: they run at once, each on a
thread of its own, and at the deadline the exporters are aborted so that nothing goes on retrying."""
from __future__ import annotations

import threading
import time

from memprof_otel.export.bounded_shutdown import shutdown_within


def test_steps_that_finish_in_time_are_not_aborted_and_share_the_deadline():
    aborted = []
    ran = []

    def step(left_s: float) -> None:
        ran.append(left_s)
        time.sleep(1.0)

    t0 = time.monotonic()
    assert shutdown_within([step, step], [lambda: aborted.append(1)], 5.0) is True
    assert time.monotonic() - t0 < 2.0  # at once: one after the other takes 2 s
    assert aborted == [] and len(ran) == 2 and all(0.0 < left <= 5.0 for left in ran)


def test_a_step_still_running_at_the_deadline_is_aborted_and_then_ends():
    # a step that retries until it is aborted, as the SDK's exporter does against a dead collector
    stop = threading.Event()
    ended = threading.Event()

    def retrying(left_s: float) -> None:
        stop.wait(60)
        ended.set()

    t0 = time.monotonic()
    assert shutdown_within([retrying], [stop.set], 0.3) is False
    took = time.monotonic() - t0
    assert 0.3 <= took < 0.3 + 0.5
    assert ended.wait(5)  # the abort ended it: nothing goes on after the shutdown


def test_a_raising_step_or_abort_never_escapes():
    def broken(left_s: float) -> None:
        raise RuntimeError("provider broke")

    assert shutdown_within([broken], [], 1.0) is True
    hang = threading.Event()

    def bad_abort() -> None:
        hang.set()
        raise RuntimeError("abort broke")

    assert shutdown_within([lambda left: hang.wait(60)], [bad_abort, hang.set], 0.1) is False


def test_no_steps_and_no_time_left():
    assert shutdown_within([], [], 0.0) is True
    blocked = threading.Event()
    t0 = time.monotonic()
    assert shutdown_within([lambda left: blocked.wait(60)], [blocked.set], 0.0) is False
    assert time.monotonic() - t0 < 0.5
