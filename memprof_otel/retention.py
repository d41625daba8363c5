"""What a retention bound drops (pure): of dated items, all but the ``keep`` newest, and any older
than ``keep_seconds``. The post-mortem history (``blackbox/history.py``) and the sweep of gone
processes' dump folders (``dumps/store.py``) apply the same bound (``blackbox.keep``, ``keep_for``)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def expired(dated: Iterable[tuple[float, T]], keep: int, keep_seconds: float, now: float) -> list[T]:
    """The items of ``(time, item)`` pairs the bound drops, newest first."""
    newest_first = sorted(dated, key=lambda d: d[0], reverse=True)
    return [item for i, (t, item) in enumerate(newest_first) if i >= keep or now - t > keep_seconds]
