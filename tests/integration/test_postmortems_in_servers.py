"""Post-mortems in real servers, with their real signals: a graceful stop is not a death, a kill
is, and every worker of a multi-worker server answers the same.

uvicorn stops on SIGTERM and then re-raises it (the process dies of the signal, no exit hook runs);
gunicorn's master sends SIGTERM to its UvicornWorkers, which do the same. The next process of the
service, started as a restart would, must file nothing for those, and must file the SIGKILLed
process with the request it was serving. The references are the test's own: the signal it sent,
the exit status the kernel reports (-15: died of SIGTERM), the pid the stuck request reported, the
shape the test requested, and the files left in the folder (``os.listdir``).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse

from tests.integration.support.demo_process import REPO, free_ports

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")]

APP = "tests.integration.support.postmortem_app:app"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
SHAPE = {"batch": 3, "seq": 11}


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMPROF_OTEL_", "OTEL_"))}
    env.update({"PYTHONPATH": str(REPO), "OTEL_SDK_DISABLED": "true", "PYTHONUNBUFFERED": "1",
                "MEMPROF_OTEL_SERVICE_NAME": "pm-server", "MEMPROF_OTEL_BLACKBOX_DIR": str(tmp_path / "bb"),
                "MEMPROF_OTEL_SAMPLER_INTERVAL": "0.2s", "POSTMORTEM_APP_STUCK": str(tmp_path / "stuck.pid"),
                "WEB_CONCURRENCY": "1"})
    env.update(extra)
    return env


def _uvicorn(port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]


def _gunicorn(port: int, workers: int) -> list[str]:
    return [sys.executable, "-m", "gunicorn", "-w", str(workers), "-k", "uvicorn.workers.UvicornWorker",
            "-b", f"127.0.0.1:{port}", "--graceful-timeout", "10", APP]


@contextmanager
def server(cmd: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _until(cond: Any, timeout: float, what: str, log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s\n{log.read_text()[-3000:] if log else ''}"
        time.sleep(0.2)


def _get(url: str, **kw: Any) -> httpx.Response | None:
    try:  # a new client each time: a new connection, so any worker may take it
        return httpx.get(url, timeout=30, **kw)
    except httpx.HTTPError:
        return None


def _ready(base: str, log: Path) -> None:
    _until(lambda: (r := _get(f"{base}/forward?batch=2&seq=8")) is not None and r.status_code == 200, 90,
           "the server answering", log)


def _handles_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM now, as the kernel says (``SigCgt`` of
    /proc/PID/status): a server worker sets its own once it serves; before that (gunicorn's
    UvicornWorker resets it to the default while it boots) a SIGTERM ends it at once, which no
    next process can tell from a SIGKILL."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except OSError:
        pass
    return False


def _serving(proc: subprocess.Popen[bytes], n: int, log: Path) -> set[int]:
    """The pids of the server's n workers, once every one handles SIGTERM (is past its boot; a
    helper child such as multiprocessing's resource tracker ignores the signal, and is not one)."""
    def kids() -> set[int] | None:
        found = {c.pid for c in psutil.Process(proc.pid).children() if _handles_sigterm(c.pid)}
        return found if len(found) >= n else None
    return _until(kids, 90, f"{n} workers handling SIGTERM", log)


def _postmortems(base: str, log: Path) -> dict[str, Any]:
    def scanned() -> dict[str, Any] | None:
        r = _get(f"{base}/v1/postmortem")
        return r.json() if r is not None and r.status_code == 200 and not r.json()["scanning"] else None
    return _until(scanned, 60, "a finished scan", log)


def _files(tmp_path: Path) -> list[str]:
    return sorted(n for n in os.listdir(tmp_path / "bb") if n.endswith(".mpbb"))


def _stuck_pid(tmp_path: Path, base: str, log: Path) -> int:
    """Starts a request that stays in layer ``blocks.1``; the pid of the process serving it."""
    path = tmp_path / "stuck.pid"
    path.unlink(missing_ok=True)
    import threading
    threading.Thread(target=_get, args=(f"{base}/stuck?batch={SHAPE['batch']}&seq={SHAPE['seq']}",),
                     daemon=True).start()
    _until(path.exists, 30, "the stuck request", log)
    time.sleep(0.6)  # a few sampler ticks write its layer
    return int(path.read_text())


def _killed_with_the_shape(doc: dict[str, Any], pid: int) -> dict[str, Any]:
    mine = [p for p in doc["postmortems"] if p["pid"] == pid]
    assert len(mine) == 1, doc["postmortems"]
    pm = mine[0]
    assert pm["reason"] == "killed" and pm["evidence"] == ["no_exit_path"], pm["evidence"]
    (flight,) = pm["in_flight"]
    assert flight["model"] == "tokens" and flight["layer"].startswith("blocks.1"), flight
    assert flight["features"].get("batch") == SHAPE["batch"], flight["features"]
    assert SHAPE["seq"] in flight["features"].values(), flight["features"]
    return pm


@pytest.mark.timeout(300)
def test_uvicorn_sigterm_is_a_graceful_stop_and_sigkill_mid_request_is_a_death(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    base, env, log = f"http://127.0.0.1:{port}", _env(tmp_path), tmp_path / "uvicorn.log"
    # GIVEN uvicorn serving an instrumented model with the shipped defaults, after some traffic
    with server(_uvicorn(port), env, log) as first:
        _ready(base, log)
        for b in (1, 2, 4):
            assert _get(f"{base}/forward?batch={b}&seq=16").status_code == 200
        # WHEN it is stopped as Kubernetes stops a container
        first.send_signal(signal.SIGTERM)
        # THEN it shut down and died of the re-raised signal: no exit hook ran, its file stayed
        assert first.wait(30) == -signal.SIGTERM, log.read_text()
    assert len(_files(tmp_path)) == 1
    # WHEN the service restarts
    with server(_uvicorn(port), env, log) as second:
        _ready(base, log)
        doc = _postmortems(base, log)
        # THEN there is no post-mortem, the stop is counted as graceful, and the file is gone
        assert doc["postmortems"] == [] and doc["graceful_stops"] == 1, doc
        metrics = _get(f"{base}/metrics", headers={"accept": OPENMETRICS}).text
        killed = [s.value for f in om_parse(metrics) if f.name == "memprof_postmortems" for s in f.samples
                  if s.name.endswith("_total")]
        assert killed and set(killed) == {0.0}, killed
        # WHEN a request is in flight and the process is SIGKILLed
        pid = _stuck_pid(tmp_path, base, log)
        assert pid == second.pid
        second.send_signal(signal.SIGKILL)
        assert second.wait(30) == -signal.SIGKILL
    # THEN the next process files that death, with the request's shape and layer
    with server(_uvicorn(port), env, log):
        _ready(base, log)
        _killed_with_the_shape(_postmortems(base, log), pid)
        assert "Traceback" not in log.read_text()


def _workers(proc: subprocess.Popen[bytes], n: int, log: Path) -> set[int]:
    def kids() -> set[int] | None:
        found = {c.pid for c in psutil.Process(proc.pid).children()}
        return found if len(found) == n else None
    return _until(kids, 60, f"{n} workers", log)


@pytest.mark.timeout(420)
def test_gunicorn_workers_stop_gracefully_and_all_serve_a_killed_siblings_death_counted_once(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    base, log = f"http://127.0.0.1:{port}", tmp_path / "gunicorn.log"
    env = _env(tmp_path, MEMPROF_OTEL_WORKERS_SNAPSHOT_DIR=str(tmp_path / "snapshots"),
               MEMPROF_OTEL_WORKERS_SNAPSHOT_INTERVAL="0.5s")
    # GIVEN gunicorn with two UvicornWorkers, each serving the instrumented model
    with server(_gunicorn(port, 2), env, log) as master:
        _ready(base, log)
        _until(lambda: len(_files(tmp_path)) == 2, 30, "both workers' black boxes", log)
        _serving(master, 2, log)  # a worker stopped while it boots dies of the signal, unhandled
        # WHEN the master is stopped with SIGTERM (a rolling deploy)
        master.send_signal(signal.SIGTERM)
        assert master.wait(60) == 0, log.read_text()[-3000:]
    left = _files(tmp_path)
    # WHEN it starts again
    with server(_gunicorn(port, 2), env, log) as master:
        workers = _workers(master, 2, log)
        _ready(base, log)
        doc = _postmortems(base, log)
        # THEN none of the stopped workers is a post-mortem (their files, if the re-raised signal
        # left them, are gone)
        assert doc["postmortems"] == [], doc["postmortems"]
        assert not set(left) & set(_files(tmp_path)), (left, _files(tmp_path))

        # WHEN one worker is SIGKILLed in the middle of a request; gunicorn starts a replacement
        victim = _stuck_pid(tmp_path, base, log)
        assert victim in workers
        os.kill(victim, signal.SIGKILL)
        _until(lambda: (w := _workers(master, 2, log)) != workers and victim not in w, 60, "the replacement", log)

        # THEN 20 requests on new connections, whichever worker takes each, all list it
        _until(lambda: any(p["pid"] == victim for p in _postmortems(base, log)["postmortems"]), 60,
               "the replacement's scan", log)
        answered: set[str] = set()
        now = _workers(master, 2, log)
        for _ in range(20):
            r = _get(f"{base}/v1/postmortem")
            assert r is not None and r.status_code == 200
            _killed_with_the_shape(r.json(), victim)
            assert int(r.headers["x-memprof-pid"]) in now  # the answer says which worker gave it
        # AND the merged exposition counts the death once, whichever worker answers
        for _ in range(6):
            fams = {f.name: f for f in om_parse(_get(f"{base}/metrics", headers={"accept": OPENMETRICS}).text)}
            killed = [s for s in fams["memprof_postmortems"].samples
                      if s.name.endswith("_total") and s.labels.get("reason") == "killed"]
            assert [(s.value, "worker" in s.labels) for s in killed] == [(1.0, False)], killed
            answered |= {s.labels["worker"] for s in fams["memprof_process_resident_memory_bytes"].samples}
        assert len(answered) >= 2, answered  # both workers' series were merged into the scrapes
        assert "Traceback" not in log.read_text()


@pytest.mark.timeout(300)
def test_uvicorn_workers_stopped_with_sigterm_leave_no_postmortem(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    base, env, log = f"http://127.0.0.1:{port}", _env(tmp_path), tmp_path / "uvicorn-workers.log"
    # GIVEN uvicorn's own supervisor with two workers, each with its black box
    with server([*_uvicorn(port), "--workers", "2"], env, log) as supervisor:
        _ready(base, log)
        _until(lambda: len(_files(tmp_path)) == 2, 60, "both workers' black boxes", log)
        _serving(supervisor, 2, log)
        # WHEN the supervisor is stopped with SIGTERM (it passes the signal on to its workers)
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(60)
    left = _files(tmp_path)
    # THEN the next process of the service files none of them, whatever the workers died of
    with server(_uvicorn(port), env, log):
        _ready(base, log)
        doc = _postmortems(base, log)
        assert doc["postmortems"] == [] and doc["graceful_stops"] == len(left), (left, doc)
        assert not set(left) & set(_files(tmp_path))


_LOGS_AND_SERVES_ON = """
import signal, sys, time, torch
import memprof_otel as mp
signal.signal(signal.SIGTERM, lambda s, f: print("SIGTERM: reopening logs", flush=True))  # serves on
model = torch.nn.Linear(8, 8)
mp.instrument(model, name="tokens")
with torch.no_grad():
    model(torch.randn(2, 8))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.mark.timeout(120)
def test_a_handled_sigterm_whose_process_served_on_and_was_then_killed_is_a_death(tmp_path: Path) -> None:
    from tests.integration.support.helpers import next_process_postmortems
    env = _env(tmp_path)
    # GIVEN a process whose SIGTERM handler only logs (it never shuts down)
    proc = subprocess.Popen([sys.executable, "-c", _LOGS_AND_SERVES_ON], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        # WHEN it gets SIGTERM, serves on, and is SIGKILLed idle later (a grace period's end)
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline().startswith("SIGTERM")
        time.sleep(0.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    # THEN the next process files its death: the stop signal was handled, the shutdown never ended
    doc = next_process_postmortems(sys.executable, env, str(REPO))
    (pm,) = [p for p in doc["postmortems"] if p["pid"] == proc.pid]
    assert pm["reason"] == "killed" and pm["evidence"] == ["no_exit_path", "after_stop_signal"], pm["evidence"]
    assert doc["graceful_stops"] == 0
