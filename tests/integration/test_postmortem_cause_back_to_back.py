"""The cause of a kernel OOM kill after requests ran back to back: the room it says the limit left
the request is the room the budget said was free between forwards.

A child (``cause_child.py``) joins a fresh v1 memory cgroup, instruments a real model (a Hugging
Face ``BertModel``, eager attention) with the shipped defaults, and runs forwards of mixed shapes
back to back, no sleep between them, so nearly every sampler tick falls inside a forward and holds
its transient (the case where the room was once reported from such a tick: far too small). Between
two forwards it reads the budget as ``GET /v1/headroom`` serves it and prints it; then, back to
back, it starts a forward far past the limit. A reader process of the same service and black box
folder then serves ``/v1/postmortem``.

The references are independent of the figures the post-mortem computes: the kernel's kill (the
child's exit status, -9) and the cgroup's own ``oom_kill`` counter, read before the cgroup is
removed; and the budget the child read itself between forwards (the limit, less what the cgroup's
working set held, less the margin), printed before the fatal forward began. Printed beside them, not
asserted: the cgroup's own memory.stat and the process's /proc status at that read, and how much the
fatal forward's layer hoarded before the kernel killed it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests import cgroup_truth

from tests.integration.support import cause_child

MIB = 1 << 20
LIMIT = 960 * MIB
SERVICE = "memprof-cause-back-to-back"
SAMPLER_INTERVAL = "0.2s"
TOLERANCE = 0.05

pytestmark = pytest.mark.timeout(150)


def _env(folder: Path, dumps: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMPROF_OTEL_", "OTEL_"))}
    env.update(MEMPROF_OTEL_BLACKBOX_DIR=str(folder), MEMPROF_OTEL_SERVICE_NAME=SERVICE,
               MEMPROF_OTEL_SAMPLER_INTERVAL=SAMPLER_INTERVAL, MEMPROF_OTEL_DUMPS_DIR=str(dumps),
               OTEL_SDK_DISABLED="true", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def _make_cgroup() -> Path | None:
    return cgroup_truth.make_v1_memory_cgroup("memprof-cause", LIMIT)


def _remove_cgroup(d: Path) -> None:
    cgroup_truth.remove_dir(d)


def _oom_kills(d: Path) -> int:
    return cgroup_truth.v1_oom_kills(d)


def _postmortems(folder: Path, dumps: Path) -> dict:
    r = subprocess.Popen([sys.executable, "-m", "tests.integration.support.cause_child", "reader"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(folder, dumps))
    try:
        url = r.stdout.readline().strip()
        assert url.startswith("http"), f"the reader never served: {url!r}"
        with httpx.Client(base_url=url, timeout=30) as c:
            return c.get("/v1/postmortem").json()
    finally:
        r.stdin.close()
        try:
            r.wait(30)
        except subprocess.TimeoutExpired:
            r.kill()
            r.wait(10)


def test_the_room_of_an_oom_kill_after_back_to_back_requests_is_what_the_budget_said(tmp_path):
    pytest.importorskip("transformers")
    folder, dumps = tmp_path / "blackbox", tmp_path / "dumps"
    cg = _make_cgroup()
    if cg is None:
        pytest.skip("no v1 memory cgroup can be made here (needs root and a writable /sys/fs/cgroup/memory)")
    lines: list[dict] = []
    try:
        # GIVEN a child in a fresh cgroup running a real model back to back under the shipped defaults
        kills_before = _oom_kills(cg)
        p = subprocess.Popen([sys.executable, "-m", "tests.integration.support.cause_child", "victim", str(cg)],
                             stdout=subprocess.PIPE, text=True, env=_env(folder, dumps))
        try:
            # WHEN it reads the budget between two forwards and at once starts one far past the limit
            lines.extend(json.loads(x) for x in p.stdout if x.startswith("{"))
            rc = p.wait(60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        kills_after = _oom_kills(cg)
    finally:
        _remove_cgroup(cg)  # gone before the reader looks, as in a container restart
    print("child:", *[x for x in lines if x["phase"] != "hoard"], sep="\n  ")
    # THEN the kernel's OOM killer ended it: SIGKILL, and the cgroup's own counter rose
    assert rc == -signal.SIGKILL, (rc, lines)
    assert kills_after > kills_before, (kills_before, kills_after)
    start = next(x for x in lines if x["phase"] == "start")
    said = next(x for x in lines if x["phase"] == "budget")
    budget = said["budget"]
    assert budget is not None, said
    assert budget["limit"] == "cgroup" and budget["limit_bytes"] == LIMIT, budget

    # AND the next process of the service names it an OOM kill
    doc = _postmortems(folder, dumps)
    by_pid = {pm["pid"]: pm for pm in doc["postmortems"]}
    assert start["pid"] in by_pid, doc
    pm = by_pid[start["pid"]]
    assert pm["reason"] == "oom_kill", (pm["reason"], pm["evidence"])
    figures, flight = pm["cause"]["figures"], pm["in_flight"]
    # killed inside the fatal forward, after its layer had begun to hoard
    assert [f["features"] for f in flight] == [{"batch": cause_child.FATAL_SHAPE[0],
                                                 "seq_len": cause_child.FATAL_SHAPE[1]}], flight
    assert any(x["phase"] == "hoard" for x in lines), lines
    busy = [s.get("busy") for s in pm["samples"]]
    print("in flight:", flight)
    print("ticks busy:", busy)
    print("cause:", json.dumps(pm["cause"], indent=1))

    # The comparison. The budget read between forwards is what a client sees: usable = limit - margin,
    # available = usable - in use, where in use is the cgroup's working set (its charge less the
    # inactive page cache the kernel reclaims before it kills). The margin is the budget's own
    # policy (5 % of the limit by default, here 48 MiB): a share it keeps back so that an answer's
    # error does not end in a kill. The kernel keeps nothing back: it kills when the charge reaches
    # the limit itself. The cause's room says what "the limit left the request": limit - what others
    # held - what was held when it began, i.e. limit - what the limit counted then. The like-for-like
    # figure is therefore available + margin = limit - working set between forwards, not available
    # alone (which would be off by the whole margin, more than the 5 % tolerance of a ~500 MiB room).
    # What the limit counts is the cgroup's charge, not the process's resident size: resident pages
    # of files whose page cache another cgroup faulted in first (the libraries torch maps, after any
    # earlier process on the host or a container's previous incarnation loaded them) are resident
    # here and charged there. The child prints both (cgroup_now: charged_mapped_file vs rss_file),
    # and how much the kernel let the fatal forward hoard before it killed it, to show which figure
    # the kill followed.
    room = figures.get("room_bytes")
    free_then = budget["available_bytes"] + budget["margin_bytes"]
    hoarded = max((x["bytes"] for x in lines if x["phase"] == "hoard"), default=0)
    before = [x for x in pm["samples"] if x["t"] <= flight[0]["started_unix"]] if flight else []
    tick = (f"limit - resident at the last tick before it (busy={before[-1].get('busy')}): "
            f"{(LIMIT - before[-1]['process']['resident_memory_bytes']) / MIB:.1f} MiB" if before else "no tick before it")
    print(f"room {room / MIB if room is not None else float('nan'):.1f} MiB | budget available "
          f"{budget['available_bytes'] / MIB:.1f} + margin {budget['margin_bytes'] / MIB:.1f} = "
          f"{free_then / MIB:.1f} MiB (in use {budget['in_use_bytes'] / MIB:.1f} MiB) | the kernel let it hoard "
          f"{hoarded / MIB:.0f} MiB | {tick} | cgroup then {said['cgroup_now']} | {len(pm['samples'])} ticks, "
          f"{busy.count(0)} between forwards, {said['forwards']} forwards")
    # AND the room the cause gives is what the budget said was free between forwards
    assert room is not None, pm["cause"]
    assert abs(room - free_then) <= TOLERANCE * free_then, (
        f"room {room} B ({room / MIB:.1f} MiB) against {free_then} B ({free_then / MIB:.1f} MiB) free between "
        f"forwards (budget {budget}, cause {figures})")
    # AND the request's own rise is a rise
    rise = figures.get("request_rise_bytes")
    assert rise is not None and rise >= 0, figures
