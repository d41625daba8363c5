"""The batch-job pattern: start monitoring, run, stop, then report. What was sampled survives the
stop (timeline, report, plot, export_timeline, /v1/timeline); a restart with the same settings
continues it, one with other settings starts anew."""
from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.runtime import runtime

from .support.helpers import wait_until

FAST = {"sampler": {"interval": "50ms"}}


def work(h: mp.Instrumentation, model: nn.Module) -> None:
    with mp.operation("batch"):
        keep = torch.ones(8 << 20)  # 32 MiB
        for _ in range(3):
            model(torch.randn(4, 16))
        time.sleep(0.3)
        del keep


def test_start_run_stop_then_report(tmp_path):
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    mp.start_monitoring(FAST)
    h = mp.instrument(model, name="batch")
    work(h, model)
    wait_until(lambda: len(mp.timeline().timestamps) >= 5, what="five samples")
    before = len(mp.timeline().timestamps)
    assert mp.stop_monitoring()
    assert not runtime().running

    tl = mp.timeline()
    assert len(tl.timestamps) >= before  # the stop lost nothing
    assert len(tl) == len(tl.timestamps)  # len() counts samples, as a user would first try
    assert [o.name for o in tl.operations] == ["batch"]
    text = mp.report()
    assert "no samples yet" not in text and "Peak during:" in text
    out = tmp_path / "t.json"
    h.export_timeline(str(out))
    assert len(json.loads(out.read_text())["samples"]) == len(tl.timestamps)
    png = tmp_path / "t.png"
    mp.plot(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    time.sleep(0.2)
    assert len(mp.timeline().timestamps) == len(tl.timestamps)  # stopped: nothing new


def test_a_restart_with_the_same_settings_continues_and_other_settings_start_anew():
    mp.start_monitoring(FAST)
    wait_until(lambda: len(mp.timeline().timestamps) >= 3, what="three samples")
    mp.stop_monitoring()
    first = mp.timeline().timestamps
    mp.start_monitoring(FAST)
    wait_until(lambda: len(mp.timeline().timestamps) > len(first), what="a new sample")
    assert mp.timeline().timestamps[:len(first)] == first  # continued
    mp.stop_monitoring()
    mp.start_monitoring({"sampler": {"interval": "60ms"}})
    wait_until(lambda: len(mp.timeline().timestamps) >= 1, what="a sample")
    assert min(mp.timeline().timestamps) > max(first)  # another config: a new history


def test_the_endpoint_serves_the_stopped_run(client):
    wait_until(lambda: len(mp.timeline().timestamps) >= 3, what="three samples")
    mp.stop_monitoring()
    n = len(mp.timeline().timestamps)
    page = client.get("/v1/timeline").json()
    assert len(page["samples"]) == n


class _Request:
    """An application object passed as an operation attribute (no JSON form of its own)."""

    def __str__(self) -> str:
        return "Request(id=7)"


def test_export_timeline_writes_strict_json_whatever_the_operation_attributes(tmp_path):
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    mp.start_monitoring(FAST)
    h = mp.instrument(model, name="attrs")
    with mp.operation("handle", request=_Request(), score=float("nan"), tags={"a", "b"}):
        model(torch.randn(4, 16))
    out = tmp_path / "t.json"
    h.export_timeline(str(out))
    doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    [op] = [o for o in doc["operations"] if o["name"] == "handle"]
    assert op["attributes"]["request"] == "Request(id=7)" and op["attributes"]["score"] is None
    assert sorted(op["attributes"]["tags"]) == ["a", "b"]
