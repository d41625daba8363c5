"""A capture always ends and never writes an empty profile silently: saved before any forward it
raises; uninstrumenting ends a pending one, with the reason, and a dump job waiting on it fails."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.runtime import runtime

from .support.helpers import wait_until


def test_saving_before_any_forward_raises_instead_of_writing_an_empty_profile(tmp_path):
    model = nn.Linear(4, 4)
    h = mp.instrument(model, name="lin")
    cap = h.capture()
    with pytest.raises(mp.MemprofError, match="no forward of 'lin' was captured yet"):
        cap.save(tmp_path / "empty.json")
    assert not (tmp_path / "empty.json").exists()
    model(torch.randn(2, 4))
    assert cap.wait(5)
    cap.save(tmp_path / "one.json")
    assert (tmp_path / "one.json").stat().st_size > 0


def test_uninstrumenting_ends_a_pending_capture_with_the_reason(tmp_path):
    h = mp.instrument(nn.Linear(4, 4), name="lin")
    cap = h.capture(forwards=3)
    h.uninstrument()
    assert cap.done and cap.wait(0)
    assert "uninstrumented" in cap.failed
    with pytest.raises(mp.MemprofError, match="uninstrumented"):
        cap.speedscope()


def test_a_dump_job_waiting_on_it_fails_as_uninstrumented(tmp_path):
    mp.start_monitoring({"dumps": {"dir": str(tmp_path / "dumps")}})
    h = mp.instrument(nn.Linear(4, 4), name="lin")
    job = runtime().dump_service.submit("lin", 1, timeout=30.0)
    h.uninstrument()
    wait_until(lambda: job.status != "pending", timeout=10, what="the job's end")
    assert job.status == "failed"
    assert "uninstrumented" in str(job.to_dict())
