"""The early warning of an OOM kill, on a real kernel and a real Prometheus: a process instrumented
with memprof-otel leaks into a memory cgroup of its own until the kernel kills it, a real
Prometheus scrapes it with the mixin's alert rules (MemprofContainerMemoryFullSoon generated for
seconds instead of minutes, through the mixin's configuration), and the alert must be firing while
the process still lives. The lead (seconds from the first firing seen to the kill) is printed: it
is what docs/runbooks.md reports.

The memory pressure (PSI) and memory event counters the process exports are checked to reach
Prometheus where the kernel has them. Skipped only where no memory cgroup can be made.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mixin import config as mixin_config
from mixin import outputs as mixin_outputs
from tests.integration.support import leak_child
from tests.integration.support.prom_server import running_prometheus
from tests.integration.test_oom_cgroup import MemoryCgroup

ALERT = "MemprofContainerMemoryFullSoon"
LIMIT = 512 << 20                 # the instrumented child starts at ~220 MiB: ~15 s of leak at 20 MiB/s
SCRAPE = "500ms"                  # the scrape and the rule evaluation interval
RULE = {"window": "5s", "horizon": "5s", "for": "1s"}
HORIZON_S = 5.0
JOB = "memprof"                   # the job prom_server scrapes under


def _rules(directory: Path) -> Path:
    """The mixin's alert rules for this Prometheus' job, the early warning scaled to seconds."""
    cfg = mixin_config.merge(mixin_config.defaults(), {"job_selector": f'job="{JOB}"',
                                                       "alerts": {"rules": {ALERT: RULE}}})
    path = directory / "alerts.yml"
    path.write_text(mixin_outputs.alerts_yml(cfg))
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    root = str(Path(__file__).parents[2])
    env.update(PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
               MEMPROF_OTEL_BLACKBOX_DIR=str(tmp_path / "blackbox"), OTEL_SDK_DISABLED="true",
               PYTHONUNBUFFERED="1")
    return env


def _kernel_has_psi(version: int, cgroup: Path) -> bool:
    candidates = [Path("/proc/pressure/memory")] + ([cgroup / "memory.pressure"] if version == 2 else [])
    for f in candidates:
        try:
            if "total=" in f.read_text():
                return True
        except OSError:
            continue
    return False


def test_the_early_warning_fires_before_the_kernel_kills_a_leaking_process(tmp_path: Path) -> None:
    cg = MemoryCgroup(LIMIT, 0)
    child = None
    try:
        # its log (sampler reads that time out as the kernel reclaims near the limit) goes to a file
        with open(tmp_path / "child.log", "w") as log:
            child = subprocess.Popen([sys.executable, "-m", "tests.integration.support.leak_child"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=log, text=True, env=_env(tmp_path),
                                     preexec_fn=cg.enter, cwd=str(Path(__file__).parents[2]))
        url = child.stdout.readline().strip()
        assert url.startswith("http://"), f"the child printed no URL: {url!r}"
        target = url.split("//", 1)[1].rstrip("/")
        with running_prometheus([target], tmp_path, rule_files=[_rules(tmp_path)], scrape_interval=SCRAPE) as prom:
            # GIVEN Prometheus has a full window of the process (the rule waits for one)
            prom.query_until(f"memprof_container_memory_working_set_bytes offset {RULE['window']}", timeout=30,
                             what="a window of the working set")
            assert prom.query("memprof_process_memory_limit_bytes")[0]["value"][1] == str(LIMIT)
            assert not prom.query(f'ALERTS{{alertname="{ALERT}"}}'), "firing before the leak"

            # WHEN the process leaks until the kernel kills it
            child.stdin.write("go\n")
            child.stdin.flush()
            leak_started = time.monotonic()
            first_firing = killed = None
            seen: dict[str, float] = {}
            while killed is None and time.monotonic() - leak_started < 60:
                firing = prom.query(f'ALERTS{{alertname="{ALERT}", alertstate="firing"}}')
                if child.poll() is not None:  # the kill came before this answer could count
                    killed = time.monotonic()
                    break
                if firing and first_firing is None:
                    first_firing = time.monotonic()
                for name, expr in (("pressure_some", 'max(memprof_memory_pressure_stall_seconds_total{kind="some"})'),
                                   ("events_max", 'max(memprof_container_memory_events_total{event="max"})')):
                    res = prom.query(expr)
                    if res:
                        seen[name] = float(res[0]["value"][1])
                time.sleep(0.05)
            if killed is None:
                killed = time.monotonic() if child.poll() is not None else None
            assert killed is not None, "the leaking child was not killed within 60 s"
            returncode = child.wait(5)

            series_names = {s["metric"]["__name__"] for s in prom.query(
                '{__name__=~"memprof_memory_pressure_stall_seconds_total|memprof_container_memory_events_total"}'
                "[1h]")}
            pressure_scopes = {s["metric"].get("scope") for s in prom.query(
                "last_over_time(memprof_memory_pressure_stall_seconds_total[1h])")}

        # THEN it was the kernel's OOM kill
        assert returncode == -signal.SIGKILL, returncode
        assert (cg.oom_kills() or 0) >= 1, "killed, but not by the kernel's OOM killer"
        # AND the alert was firing while the process still lived
        assert first_firing is not None, f"{ALERT} never fired before the kill"
        lead = killed - first_firing
        print(f"\nearly warning: {ALERT} ({RULE}, scrape and evaluation every {SCRAPE}) fired "
              f"{lead:.1f} s before the kernel killed a process leaking "
              f"{leak_child.CHUNK_BYTES / leak_child.STEP_S / (1 << 20):.0f} MiB/s into a {LIMIT >> 20} MiB cgroup "
              f"(leak to kill {killed - leak_started:.1f} s); last seen: {seen}")
        assert lead > 0
        # AND the projection fired it, not the level: a steady leak reaches the limit about `horizon`
        # after the line first passes it (the last MiB come a little slower as the kernel reclaims);
        # an alert firing from the leak's start would lead by nearly all of its ~15 s
        assert lead <= HORIZON_S + 4, f"fired {lead:.1f} s before the kill: far earlier than the {HORIZON_S} s horizon"
        # AND the memory event counter (v2 memory.events, v1 memory.failcnt) and, where the kernel has
        # PSI, the pressure stall totals reached Prometheus
        assert "memprof_container_memory_events_total" in series_names
        if _kernel_has_psi(cg.version, cg.dir):
            assert "memprof_memory_pressure_stall_seconds_total" in series_names
            assert pressure_scopes == {"cgroup" if cg.version == 2 and (cg.dir / "memory.pressure").exists()
                                       else "system"}, pressure_scopes
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(5)
        cg.close()
