"""The black box's startup scan files the post-mortems of the service's dead processes and stores
each as a dump at once, from its own thread: the folder must be the one of the service the config
names, so the scan may only begin once the runtime's config is in force (before, a busy machine's
scan stored one of two post-mortems in the unnamed default service's folder)."""
from __future__ import annotations

import os
from typing import Any

import pytest
from torch import nn

import memprof_otel as mp
from memprof_otel.blackbox.service import BlackBox
from memprof_otel.dumps.store import default_dir


def test_the_black_box_starts_with_the_dump_folder_of_the_configured_service(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    start = BlackBox.start

    def spy(self: BlackBox, *args: Any, **kwargs: Any) -> None:
        # where a post-mortem filed by the scan this start begins would be stored
        seen.append(str(self._store_json.__self__.dir))  # type: ignore[attr-defined]
        start(self, *args, **kwargs)

    monkeypatch.setattr(BlackBox, "start", spy)
    monkeypatch.setenv("MEMPROF_OTEL_SERVICE_NAME", "scan-order-svc")
    try:
        mp.instrument(nn.Linear(4, 4), name="tiny")
        assert seen and seen[0] == str(default_dir("scan-order-svc", os.getpid())), seen
    finally:
        mp.shutdown()
