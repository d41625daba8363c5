"""Post-mortems across processes, with real kills: a child SIGKILLed by the test mid-forward, and
one the kernel OOM-kills mid-forward in a memory cgroup of its own (cgroup v1 here). The next
process with the same black box folder names each, through its real HTTP endpoint, with the
reason, the forward in flight (shape and layer) and the samples of its last window; its
``memprof_postmortems_total`` counts them and ``/v1/dumps`` lists them.

The references are the test's own: the signal it sent, the kernel's exit status of the child
(-9) and the cgroup's ``oom_kill`` counter read before the cgroup is removed (as Kubernetes
replaces a restarted container's cgroup: the record must carry its evidence itself), the shape
the child was given, and the ticks a sampler of a known interval takes in a window.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests import cgroup_truth

from tests.integration.support import blackbox_child as child

WINDOW_S = 3.0
LIMIT = 700 << 20


def _env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    # one service: the victims and the reader run different commands, so an unnamed service's key
    # (a digest of the command) would tell them apart
    env.update(MEMPROF_OTEL_SERVICE_NAME="bb-victims", MEMPROF_OTEL_BLACKBOX_DIR=str(folder),
               MEMPROF_OTEL_BLACKBOX_WINDOW=str(WINDOW_S),
               OTEL_SDK_DISABLED="true", PYTHONUNBUFFERED="1")
    return env


def _victim(folder: Path, mode: str, cgroup: Path | None = None) -> subprocess.Popen:
    args = [sys.executable, "-m", "tests.integration.support.blackbox_child", "victim", mode]
    if cgroup is not None:
        args.append(str(cgroup))
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=_env(folder))


def _wait_long(p: subprocess.Popen) -> int:
    line = p.stdout.readline()
    assert line.startswith("long "), f"the child never reached its long forward: {line!r}"
    return int(line.split()[1])


def _make_cgroup() -> Path | None:
    return cgroup_truth.make_v1_memory_cgroup("memprof-bb", LIMIT)


def _remove_cgroup(d: Path) -> None:
    cgroup_truth.remove_dir(d)


def _oom_kills(d: Path) -> int:
    return cgroup_truth.v1_oom_kills(d)


def _ticks_in_last_window(samples: list[dict]) -> int:
    last = samples[-1]["t"]
    return sum(1 for s in samples if s["t"] > last - WINDOW_S + child.INTERVAL_S / 2)


def _check_flight(pm: dict) -> None:
    assert [(f["model"], f["features"], f["layer"]) for f in pm["in_flight"]] == [
        ("victim", {"batch": child.LONG_SHAPE[0], "seq_len": child.LONG_SHAPE[1]}, "blocks.1")]
    expected = WINDOW_S / child.INTERVAL_S
    got = _ticks_in_last_window(pm["samples"])
    assert got >= 0.95 * expected, f"{got} ticks of the last {WINDOW_S} s, {expected:.0f} expected"


def _figures_by_hand(pm: dict) -> dict:
    """The cause's figures computed here from the record's own ticks: what was held when the forward
    in flight began (the resident size read at its start, else at the last tick between forwards
    before it), in the cgroup's terms (plus its working set less the resident size: their median
    difference over the last 15 ticks before the start), the C heap's growth since that tick,
    resident memory outside the heap."""
    samples, flight = pm["samples"], pm["in_flight"][0]
    before = [s for s in samples if s["t"] <= flight["started_unix"]] or samples[:1]
    idle = [s for s in before if s.get("busy", 0) == 0]
    last = samples[-1]
    gaps = sorted(s["container"]["memory_working_set_bytes"] - s["process"]["resident_memory_bytes"]
                  for s in before[-15:] if "memory_working_set_bytes" in (s.get("container") or {}))
    gap = gaps[len(gaps) // 2] if gaps else None

    def heap(s: dict) -> int | None:
        return (s.get("allocators") or {}).get("cpu", {}).get("allocated_bytes")

    rss1 = last["process"]["resident_memory_bytes"]
    if not idle:  # every tick fell inside a forward: the level read at the start alone
        level = flight["start_resident_bytes"]
        static = level if gap is None else max(0, level + gap)
        return {"static_bytes": int(static), "room_bytes": int(LIMIT - static), "request_rise_bytes": int(rss1 - level)}
    start = idle[-1]
    rss0 = start["process"]["resident_memory_bytes"]
    static = flight.get("start_resident_bytes", rss0)
    if gap is not None:
        static = max(0, static + gap)
    out = {"static_bytes": int(static), "room_bytes": int(LIMIT - static)}
    if heap(start) is not None and heap(last) is not None:
        out["request_rise_bytes"] = int(heap(last) - heap(start))
        out["outside_growth_bytes"] = int(max(0, rss1 - heap(last)) - max(0, rss0 - heap(start)))
    return out


def _check_cause(pm: dict) -> None:
    """The OOM kill's cause follows from its figures: the request's predicted peak over the room, else
    whichever of the request's heap growth and the growth outside the heap took at least half of it."""
    cause, mine = pm["cause"], _figures_by_hand(pm)
    got = cause["figures"]
    assert {k: got.get(k) for k in mine} == mine, cause
    predicted = pm["in_flight"][0].get("predicted_peak_bytes")
    movers = {"request_too_big": mine.get("request_rise_bytes"), "outside_allocator": mine.get("outside_growth_bytes")}
    took = {k: v for k, v in movers.items() if v is not None and v > 0 and v >= mine["room_bytes"] / 2}
    expected = ("request_too_big" if predicted is not None and predicted > mine["room_bytes"] else
                max(took, key=took.get) if took else "unknown")
    assert cause["cause"] == expected, cause
    if expected != "unknown":
        assert cause["knob"]


def test_a_sigkilled_and_an_oom_killed_process_are_named_by_the_next_one(tmp_path):
    folder = tmp_path / "blackbox"
    cg = _make_cgroup()
    if cg is None:
        pytest.skip("no memory cgroup (v1) can be created here (needs root and a writable /sys/fs/cgroup/memory)")
    try:
        # side by side, as two workers of one service: neither reads the other's file while it runs
        p = _victim(folder, "sigkill")
        q = _victim(folder, "oom", cg)
        # (a) SIGKILLed by us, mid-forward
        killed_pid = _wait_long(p)
        time.sleep(1.0)  # inside the long forward, past several ticks
        killed_at = time.time()
        p.send_signal(signal.SIGKILL)
        assert p.wait(30) == -signal.SIGKILL
        # (b) OOM-killed by the kernel, mid-forward
        oom_pid = _wait_long(q)
        assert q.wait(120) == -signal.SIGKILL
        assert _oom_kills(cg) >= 1  # the kernel's own count: it was the OOM killer
    finally:
        _remove_cgroup(cg)  # gone before the next process looks, as in a container restart
    left = sorted(x.name for x in folder.iterdir() if x.name.endswith(".mpbb"))
    assert left == sorted([n for n in left if n.startswith((f"{killed_pid}-", f"{oom_pid}-"))]) and len(left) == 2

    r = subprocess.Popen([sys.executable, "-m", "tests.integration.support.blackbox_child", "reader"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(folder))
    try:
        url = r.stdout.readline().strip()
        with httpx.Client(base_url=url, timeout=30) as c:
            doc = c.get("/v1/postmortem").json()
            metrics = c.get("/metrics").text
            dumps = c.get("/v1/dumps").json()["dumps"]
    finally:
        r.stdin.close()
        r.wait(30)
    by_pid = {pm["pid"]: pm for pm in doc["postmortems"]}
    for pm in doc["postmortems"]:  # what the report shows, for the log of a failing run
        print(pm["pid"], pm["reason"], pm["evidence"], pm["in_flight"], _ticks_in_last_window(pm["samples"]),
              len(pm["samples"]), pm["near_limit"], pm["torn_slots"], pm["cause"])
    assert set(by_pid) == {killed_pid, oom_pid}, doc

    killed = by_pid[killed_pid]
    assert (killed["reason"], killed["evidence"]) == ("killed", ["no_exit_path"])
    _check_flight(killed)
    assert killed["samples"][-1]["t"] >= killed_at - 1.0  # the record ran until the kill

    oom = by_pid[oom_pid]
    assert oom["reason"] == "oom_kill"
    # the cgroup is gone: the evidence the process wrote itself decides (the kernel log may add to it)
    assert {"limit_reached", "oom_event"} & set(oom["evidence"]), oom["evidence"]
    assert "oom_kill_counter" not in oom["evidence"]
    assert oom["limit_bytes"] == LIMIT
    assert oom["in_flight"][0]["limit_reached"] is True
    _check_flight(oom)
    _check_cause(oom)
    # a SIGKILL from outside claims no memory cause
    assert killed["cause"]["cause"] == "unknown" and "no memory cause" in killed["cause"]["summary"]

    for reason in ("killed", "oom_kill"):
        assert re.search(rf'^memprof_postmortems_total{{reason="{reason}"}} 1\.0$', metrics, re.M), reason
    # each post-mortem's dump is listed (the ids, for the log of a failing run)
    assert sorted(d["kind"] for d in dumps if d["kind"] == "postmortem") == ["postmortem", "postmortem"], (
        [(pm["pid"], pm.get("dump_id")) for pm in doc["postmortems"]], dumps, doc.get("scanning"))
    # claimed and removed; the reader's own file went with its clean shutdown
    assert list(folder.glob("*.mpbb")) == []
