"""The background sampler with sources the test controls: bounded buffer, per-source faults that
cost only that source, listeners that fail, a bounded stop, and re-arming after fork."""
from __future__ import annotations

import itertools
import json
import os
import statistics
import threading
import time

import pytest

from memprof_otel.telemetry.sampler import Sampler, SourceSpec, check_gpus
from memprof_otel.telemetry.series import SelfView, build_series
from memprof_otel.timeline import GpuReading, Sample

INTERVAL = 0.1


def counter_source(name: str = "n") -> SourceSpec:
    c = itertools.count(1)
    return SourceSpec(name, lambda: {"allocated_bytes": next(c)})


def good(value: float = 5.0) -> SourceSpec:
    return SourceSpec("good", lambda: {"allocated_bytes": value})


def wait_for(pred, timeout: float = 5.0, step: float = 0.01) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


@pytest.fixture
def samplers():
    made: list[Sampler] = []

    def make(*args, **kw) -> Sampler:
        s = Sampler(*args, **kw)
        made.append(s)
        return s
    yield make
    for s in made:
        s.stop(2.0)


def test_ring_buffer_keeps_only_the_newest_buffer_size_samples(samplers):
    s = samplers([counter_source()], interval_s=1.0, buffer_size=5)
    for _ in range(12):
        s.tick()
    kept = s.samples()
    assert len(kept) == 5
    assert [smp.allocators["n"]["allocated_bytes"] for smp in kept] == [8, 9, 10, 11, 12]
    assert s.latest() is kept[-1]
    assert s.ticks == 12


def test_samples_since_filters_on_the_sample_clock(samplers):
    now = iter([100.0, 101.0, 102.0, 103.0])
    s = samplers([good()], interval_s=1.0, clock=lambda: next(now))
    for _ in range(4):
        s.tick()
    assert [smp.t for smp in s.samples(since_unix=102.0)] == [102.0, 103.0]


def _raises():
    raise OSError("device went away")


GARBAGE = {
    "raises": _raises,
    "negative": lambda: {"allocated_bytes": -1},
    "nan": lambda: {"allocated_bytes": float("nan")},
    "inf": lambda: {"allocated_bytes": float("inf")},
    "string_figure": lambda: {"allocated_bytes": "12"},
    "bool_figure": lambda: {"allocated_bytes": True},
    "not_a_mapping": lambda: [("allocated_bytes", 1)],
    "none": lambda: None,
}


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_a_faulty_source_is_counted_and_the_others_still_report(samplers, kind):
    # the faulty source comes first, so an implementation that gives up on the rest of the tick fails
    bad = SourceSpec("bad", GARBAGE[kind])
    proc = SourceSpec("process", lambda: {"resident_memory_bytes": 1000})
    s = samplers([bad, good(7), proc], interval_s=1.0)
    for i in range(1, 4):
        smp = s.tick()
        assert s.errors["bad"] == i
        assert s.up == {"bad": False, "good": True, "process": True}
        assert "bad" not in smp.allocators
        assert smp.allocators["good"] == {"allocated_bytes": 7}
        assert smp.rss == 1000
    assert s.errors["good"] == 0 and s.errors["process"] == 0
    assert s.last_error["bad"]
    assert s.health()["sources"]["bad"] == {"up": False, "errors": 3, "last_error": s.last_error["bad"]}


def test_garbage_gpu_readings_are_counted():
    ok = GpuReading(0, "GPU-0", "T4", "550", used_bytes=1, total_bytes=2, process_used_bytes=None)
    assert check_gpus([ok], "nvml") == (ok,)
    neg = GpuReading(0, "GPU-0", "T4", "550", used_bytes=-1, total_bytes=2, process_used_bytes=None)
    s = Sampler([SourceSpec("nvml", lambda: [neg], check_gpus), good()], interval_s=1.0)
    try:
        smp = s.tick()
    finally:
        s.stop()
    assert s.errors["nvml"] == 1 and s.up["nvml"] is False and smp.gpus == ()
    assert smp.allocators["good"] == {"allocated_bytes": 5.0}


def test_a_source_that_recovers_is_up_again(samplers):
    broken = {"on": True}

    def flaky():
        if broken["on"]:
            raise RuntimeError("transient")
        return {"allocated_bytes": 42}
    s = samplers([SourceSpec("flaky", flaky)], interval_s=1.0)
    s.tick()
    s.tick()
    assert s.up["flaky"] is False and s.errors["flaky"] == 2
    broken["on"] = False
    smp = s.tick()
    assert s.up["flaky"] is True and smp.allocators["flaky"] == {"allocated_bytes": 42}
    assert s.errors["flaky"] == 2  # the count is cumulative, not reset by a good read


@pytest.mark.timeout(60)
def test_a_hung_source_costs_a_timeout_not_the_tick_and_recovers(samplers):
    release = threading.Event()
    entered = threading.Event()

    def hang():
        entered.set()
        release.wait(30)
        return {"allocated_bytes": 99}

    proc = SourceSpec("process", lambda: {"resident_memory_bytes": 1000})
    s = samplers([SourceSpec("hang", hang), good(3), proc], interval_s=INTERVAL)
    try:
        s.start()
        assert wait_for(lambda: s.ticks >= 10)
        stuck = s.samples()
        # every tick, the first one included, has the healthy sources' figures
        assert all(smp.allocators.get("good") == {"allocated_bytes": 3} for smp in stuck)
        assert all(smp.rss == 1000 for smp in stuck)
        assert all("hang" not in smp.allocators for smp in stuck)
        assert entered.is_set() and s.up["hang"] is False and s.errors["hang"] >= len(stuck)
        assert s.errors["good"] == 0 and s.errors["process"] == 0
        # ticks keep their pace: the hung read costs at most one interval's wait
        gaps = [b.t - a.t for a, b in zip(stuck, stuck[1:])]
        assert statistics.median(gaps) < INTERVAL * 1.5
        assert max(gaps) < INTERVAL * 3
        assert s.last_duration_s < INTERVAL
    finally:
        release.set()
    healed_from = s.ticks
    assert wait_for(lambda: s.up["hang"] and s.ticks > healed_from + 2)
    assert s.latest().allocators["hang"] == {"allocated_bytes": 99}
    assert s.latest().allocators["good"] == {"allocated_bytes": 3}


def test_listener_errors_are_counted_and_ticking_goes_on(samplers):
    seen: list[float] = []

    def bad_listener(sample):
        raise ValueError("listener bug")

    s = samplers([good()], interval_s=0.02)
    s.add_listener(bad_listener)
    s.add_listener(lambda smp: seen.append(smp.t))
    s.start()
    assert wait_for(lambda: s.ticks >= 5)
    assert s.running
    n = s.ticks
    assert s.listener_errors >= 5
    assert len(seen) >= 5  # the listener after the failing one still runs every tick
    assert wait_for(lambda: s.ticks > n)
    s.remove_listener(bad_listener)
    errors = s.listener_errors
    t = s.ticks
    assert wait_for(lambda: s.ticks >= t + 3)
    assert s.listener_errors == errors


def test_a_failing_current_operation_callback_does_not_break_the_tick(samplers):
    def boom():
        raise RuntimeError("no")
    s = samplers([good()], interval_s=1.0, current_operation=boom)
    assert s.tick().operation is None
    s2 = samplers([good()], interval_s=1.0, current_operation=lambda: "generate")
    assert s2.tick().operation == "generate"


def test_stop_joins_within_its_timeout(samplers):
    s = samplers([good()], interval_s=0.05)
    s.start()
    assert wait_for(lambda: s.ticks >= 2)
    thread = s._thread
    t0 = time.monotonic()
    assert s.stop(2.0) is True
    assert time.monotonic() - t0 < 2.0
    assert not thread.is_alive() and not s.running
    n = s.ticks
    time.sleep(0.2)
    assert s.ticks == n


@pytest.mark.timeout(60)
def test_stop_is_bounded_even_while_a_source_hangs(samplers):
    release = threading.Event()
    s = samplers([SourceSpec("hang", lambda: release.wait(30) and {"x": 1}), good()], interval_s=0.5)
    try:
        s.start()
        assert wait_for(lambda: s.errors["hang"] >= 1)
        t0 = time.monotonic()
        assert s.stop(2.0) is True
        assert time.monotonic() - t0 < 2.0
    finally:
        release.set()


def test_start_is_idempotent_and_restartable(samplers):
    s = samplers([good()], interval_s=0.02)
    s.start()
    first = s._thread
    s.start()
    assert s._thread is first
    s.stop(2.0)
    s.start()
    assert s.running and s._thread is not first
    n = s.ticks
    assert wait_for(lambda: s.ticks > n)


def test_duration_and_last_success_follow_the_process_source(samplers):
    clock = iter([1000.0, 2000.0, 3000.0])
    proc_ok = {"on": True}

    def proc():
        if not proc_ok["on"]:
            raise OSError("proc unreadable")
        return {"resident_memory_bytes": 10}

    def slow():
        time.sleep(0.03)
        return {"allocated_bytes": 1}

    s = samplers([SourceSpec("process", proc), SourceSpec("slow", slow)], interval_s=1.0,
                 clock=lambda: next(clock))
    assert s.last_success_unix == 0.0 and s.last_duration_s == 0.0
    s.tick()
    assert s.last_success_unix == 1000.0
    assert 0.03 <= s.last_duration_s < 0.9
    proc_ok["on"] = False
    s.tick()
    assert s.last_success_unix == 1000.0  # a tick without the process source is no success
    proc_ok["on"] = True
    s.tick()
    assert s.last_success_unix == 3000.0
    h = s.health()
    assert h["ticks"] == 3 and h["last_success_unix"] == 3000.0
    assert h["last_duration_seconds"] == s.last_duration_s


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_sampler_rearms_in_a_forked_child(samplers):
    s = samplers([SourceSpec("process", lambda: {"resident_memory_bytes": 1, "pid": os.getpid()})],
                 interval_s=0.02)
    s.start()
    parent = os.getpid()
    assert wait_for(lambda: s.ticks >= 2)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report through the pipe, never return into pytest
        code = 1
        try:
            os.close(r)
            me = os.getpid()
            found = wait_for(lambda: sum(smp.process.get("pid") == me for smp in s.samples()) >= 3, 5.0)
            # (a tick whose read timed out on a loaded machine has no figures: no pid to compare)
            out = {"found": found, "running": s.running,
                   "pids": sorted({int(smp.process["pid"]) for smp in s.samples() if "pid" in smp.process}),
                   "me": me}
            os.write(w, json.dumps(out).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    child = json.loads(b"".join(chunks))
    assert child["me"] == pid
    assert child["found"] is True and child["running"] is True
    assert child["pids"] == [pid]  # the parent's samples were not carried into the child
    # the parent's sampler is untouched
    n = s.ticks
    assert wait_for(lambda: s.ticks > n)
    assert s.latest().process["pid"] == parent


def test_cgroup_figures_become_the_container_series_not_an_allocator(samplers):
    # the cgroup source has no limit or quota here: those series are absent, not 0
    cgroup = SourceSpec("cgroup", lambda: {"memory_usage_bytes": 3 * 2**30, "memory_working_set_bytes": 2**31,
                                           "oom_kills": 1})
    proc = SourceSpec("process", lambda: {"resident_memory_bytes": 1000, "cpu_seconds": 12.5})
    s = samplers([cgroup, proc], interval_s=1.0)
    sample = s.tick()
    assert sample.allocators == {} and sample.container["oom_kills"] == 1
    assert Sample.from_dict(sample.to_dict()) == sample
    series = build_series(sample, [], SelfView(sources_up={"cgroup": True}))
    assert series["memprof_container_memory_usage_bytes"] == [({}, 3.0 * 2**30)]
    assert series["memprof_container_memory_working_set_bytes"] == [({}, 2.0**31)]
    assert series["memprof_container_oom_kills_total"] == [({}, 1.0)]
    assert series["memprof_process_cpu_seconds_total"] == [({}, 12.5)]
    assert "memprof_container_cpu_limit_cores" not in series and "memprof_allocator_allocated_bytes" not in series
    assert ({"source": "cgroup"}, 1.0) in series["memprof_source_up"]
    # no PSI, no memory events: their families are absent, not 0
    assert "memprof_memory_pressure_stall_seconds_total" not in series
    assert "memprof_container_memory_events_total" not in series


@pytest.mark.parametrize("scope", ["cgroup", "system"])
def test_pressure_and_memory_events_become_labelled_counters(scope: str) -> None:
    container = {"memory_usage_bytes": 1.0, f"memory_pressure_{scope}_some_seconds": 2.5,
                 f"memory_pressure_{scope}_full_seconds": 1.25, "memory_events_max": 41.0}
    series = build_series(Sample(t=1.0, process={}, container=container), [], SelfView())
    assert sorted(series["memprof_memory_pressure_stall_seconds_total"], key=lambda r: r[0]["kind"]) == [
        ({"kind": "full", "scope": scope}, 1.25), ({"kind": "some", "scope": scope}, 2.5)]
    assert series["memprof_container_memory_events_total"] == [({"event": "max"}, 41.0)]  # v1: no "high"
