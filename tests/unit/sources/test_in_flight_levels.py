"""The levels at which the forwards in flight began, per device: what a budget read mid-forward
takes off as that forward's own transient."""
from __future__ import annotations

import os

from memprof_otel.sources.in_flight_levels import InFlightLevels
from memprof_otel.sources.process_hwm import STALE_S

MIB = 1 << 20


def test_the_lowest_open_start_of_the_device_is_the_level_between_forwards() -> None:
    t = [0.0]
    levels = InFlightLevels(clock=lambda: t[0])
    assert levels.start("cuda:0") is None and levels.excess("cuda:0", 900 * MIB) == 0  # none in flight
    a = levels.open("cuda:0", 300 * MIB)
    b = levels.open("cuda:0", 340 * MIB)  # began while a ran: a's transient is in its level
    levels.open("cuda:1", 10 * MIB)
    assert levels.start("cuda:0") == 300 * MIB and levels.start("cuda:1") == 10 * MIB
    assert levels.excess("cuda:0", 700 * MIB) == 400 * MIB
    assert levels.excess("cuda:0", 200 * MIB) == 0  # something freed meanwhile: never a negative excess
    levels.close(a)
    assert levels.start("cuda:0") == 340 * MIB
    levels.close(b)
    levels.close(b)  # closing twice is harmless
    assert levels.start("cuda:0") is None


def test_an_abandoned_start_is_forgotten_and_a_forked_child_has_none(monkeypatch) -> None:
    t = [0.0]
    levels = InFlightLevels(clock=lambda: t[0])
    levels.open("cuda:0", 100 * MIB)
    t[0] = STALE_S + 1  # its thread never ended it
    assert levels.start("cuda:0") is None
    levels.open("cuda:0", 100 * MIB)
    monkeypatch.setattr(os, "getpid", lambda: -7)  # now in a forked child
    assert levels.start("cuda:0") is None
