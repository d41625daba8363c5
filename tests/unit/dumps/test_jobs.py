"""Dump requests: the job states and their JSON, the bounded table, and ``DumpService.submit``
answering at once while a worker thread waits for the forwards."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from memprof_otel.config import DumpsConfig
from memprof_otel.dumps.capture import Capture
from memprof_otel.dumps.jobs import COMPLETE, FAILED, JOB_ID_RE, PENDING, DumpJob, DumpJobs, error_code
from memprof_otel.dumps.service import DumpService
from memprof_otel.dumps.store import ID_RE, DumpInfo
from memprof_otel.errors import CaptureBusy, CaptureTimeout, ExportError, UnknownModel


def info(dump_id: str = "20231114T221320Z-m-0000abcd") -> DumpInfo:
    return DumpInfo(dump_id, Path("/x") / f"{dump_id}.speedscope.json", 10, 1.0, "speedscope", "m")


def test_a_job_is_pending_until_it_completes_once():
    job = DumpJob("m", 2, 30.0)
    assert JOB_ID_RE.fullmatch(job.id) and not ID_RE.fullmatch(job.id)  # never mistaken for a dump id
    d = job.to_dict("http://h")
    assert (d["status"], d["dump"], d["error"], d["finished"], d["url"]) == \
        (PENDING, None, None, None, f"http://h/v1/dumps/{job.id}")
    assert not job.wait(0.01)
    job.complete(info(), info("20231114T221320Z-m-0000ffff"))
    job.fail(RuntimeError("late"))  # a finished job stays as it ended
    d = job.to_dict()
    assert d["status"] == COMPLETE and d["error"] is None and job.wait(0)
    assert d["dump"]["url"] == "/v1/dumps/20231114T221320Z-m-0000abcd"
    assert d["dump"]["cuda_snapshot"]["id"] == "20231114T221320Z-m-0000ffff"


@pytest.mark.parametrize("exc, code", [
    (CaptureTimeout("no forward"), "no_forward_in_time"), (ExportError("disk full"), "dump_not_stored"),
    (CaptureBusy("busy"), "capture_in_progress"), (UnknownModel("gone"), "unknown_model"),
    (ZeroDivisionError("bug"), "internal"),
])
def test_a_failed_job_names_its_error(exc, code):
    job = DumpJob("m", 1, 1.0)
    job.fail(exc)
    d = job.to_dict()
    assert (d["status"], d["error"], d["detail"], d["dump"]) == (FAILED, code, str(exc), None)
    assert error_code(exc) == code


def test_the_table_keeps_every_pending_job_and_the_newest_finished():
    jobs = DumpJobs(max_finished=2)
    pending = DumpJob("p", 1, 1.0)
    jobs.add(pending)
    finished = []
    for i in range(4):
        j = DumpJob(f"m{i}", 1, 1.0)
        jobs.add(j)
        j.complete(info())
        jobs.evict()
        finished.append(j)
    assert jobs.get(pending.id) is pending
    assert [jobs.get(j.id) for j in finished] == [None, None, finished[2], finished[3]]
    assert len(jobs) == 3
    with pytest.raises(ValueError):
        DumpJobs(0)


class FakeHandle:
    """An instrumented model as the service sees it: ``capture`` arms a real ``Capture``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cap: Capture | None = None

    def capture(self, forwards: int = 1) -> Capture:
        if self.cap is not None and not self.cap.done:
            raise CaptureBusy(f"a capture of {self.name!r} is running")
        self.cap = Capture(self.name, forwards)
        return self.cap

    def forward(self) -> None:
        cap = self.cap
        if cap is not None and cap.claim():
            cap.forward_started(time.time())
            cap.on_alloc("aten::empty", 1024)
            cap.forward_finished(time.time())


def service(tmp_path, *handles: FakeHandle) -> tuple[DumpService, list[tuple[str, str]]]:
    counted: list[tuple[str, str]] = []
    svc = DumpService(lambda: {h.name: h for h in handles}, lambda: DumpsConfig(dir=str(tmp_path / "d")),
                      lambda f, r: counted.append((f, r)))
    return svc, counted


def test_submit_answers_at_once_and_the_worker_completes_the_job(tmp_path):
    h = FakeHandle("m")
    svc, counted = service(tmp_path, h)
    t0 = time.monotonic()
    job = svc.submit("m", forwards=2, timeout=10.0, reason="test")
    assert time.monotonic() - t0 < 0.5 and job.status == PENDING
    assert svc.jobs.get(job.id) is job
    with pytest.raises(CaptureBusy):  # the capture is armed: a second request is refused at once
        svc.submit("m")
    h.forward()
    h.forward()
    assert job.wait(10)
    assert job.status == COMPLETE and job.dump is not None
    assert [d.id for d in svc.store.list()] == [job.dump.id]
    assert counted == [("speedscope", "busy"), ("speedscope", "ok")]


def test_submit_fails_the_job_when_no_forward_comes(tmp_path):
    h = FakeHandle("m")
    svc, counted = service(tmp_path, h)
    job = svc.submit("m", timeout=0.05)
    assert job.wait(10)
    assert (job.status, job.error) == (FAILED, "no_forward_in_time")
    assert h.cap is not None and h.cap.cancelled  # nothing stays armed
    assert svc.store.list() == [] and counted == [("speedscope", "timeout")]


def test_submit_raises_at_once_for_an_unknown_model(tmp_path):
    svc, _ = service(tmp_path, FakeHandle("m"))
    with pytest.raises(UnknownModel):
        svc.submit("nope")
    assert len(svc.jobs) == 0


def test_default_folder_is_this_processes_own(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    svc = DumpService(lambda: {}, lambda: DumpsConfig(), lambda f, r: None, lambda: "my-svc")
    assert svc.dir == tmp_path / f"memprof-otel-dumps-my-svc-{os.getpid()}"
    assert svc.store.dir == svc.dir
