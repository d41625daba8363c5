"""What a service built once reads of the objects a start builds anew.

The composition root has two lifetimes. Some services live as long as the process (the scrape
view, the series budget, the advice, the OOM explainer); others are built again at every start,
with that start's config (the sampler, the leak watch, the watchdog). The root keeps the second kind
in one record, replaced whole by each start, stop and shutdown, and hands the first kind a getter
of it (``CurrentStart``): a reader takes the record once per read, so what it reads belongs to one
start, and a restart is seen at the next read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from ..config import Config
from .leaks import LeakWatch
from .sampler import Sampler


class StartedView(Protocol):
    """The part of the root's record of the last start that services built once read."""

    @property
    def config(self) -> Config | None:
        """The config in force (None before the first start and after a shutdown)."""

    @property
    def sampler(self) -> Sampler | None:
        """The running sampler (None when monitoring is not running)."""

    @property
    def leaks(self) -> LeakWatch | None:
        """The last start's leak watch (None before the first start)."""


@dataclass(frozen=True)
class _NotStarted:
    config: Config | None = None
    sampler: Sampler | None = None
    leaks: LeakWatch | None = None


# what a reader gets before the first start: nothing configured, nothing sampled, nothing watched
NOT_STARTED: StartedView = _NotStarted()

# the root's getter of its record of the last start (NOT_STARTED before the first)
CurrentStart = Callable[[], StartedView]


__all__ = ["CurrentStart", "NOT_STARTED", "StartedView"]
