"""The memory breakdown's own arithmetic and its goal, checked on every document a test reads
(``GET /v1/memory``'s per-device part): the parts and ``unexplained`` sum to the total, each
measured part names its source and age, and what is left unexplained is a share of RSS."""
from __future__ import annotations

from typing import Any

MIB = 1 << 20
UNEXPLAINED_GOAL = 0.05  # of RSS: the goal the breakdown is built for
TICK_BOUND = 0.08        # one tick's looser bound (see the tests' comments)


def check_sums(cpu: dict[str, Any]) -> float:
    """The parts and unexplained add up to the total; returns unexplained / total."""
    assert cpu["total_source"] == "rss"
    assert sum(cpu["components"].values()) + cpu["unexplained_bytes"] == cpu["total_bytes"]
    for name, m in cpu["measured"].items():
        # ages: a tick's figures, glibc's (backed off by its cost) or the Python heap's (read at most
        # every 5 s): under 10 s on a quiet machine that ticks every second; glibc's read was 12.5 s
        # old with both cores busy (its back-off grows with the read's cost), hence 30
        assert m["bytes"] == cpu["components"][name] and m["source"] and 0 <= m["age_seconds"] < 30.0, name
    return cpu["unexplained_bytes"] / cpu["total_bytes"]
