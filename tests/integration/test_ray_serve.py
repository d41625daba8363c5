"""examples/ray_serve_app.py under a real Ray Serve: two replicas, each instrumented once in its
``__init__``, send their per-layer figures both ways, told apart by the replica's identity — pushed
over OTLP to a real receiver (``service.instance.id`` and ``ray.serve.*`` resource attributes) and
scraped by a real Prometheus that finds each replica's own port through the file_sd target files
the replicas write (``ray_serve_*`` target labels). Scaled down to one replica, the stopped
replica's series end: Prometheus drops its target and its series go stale at once (not after the
5-minute lookback); over OTLP it sends one final export, from the ``mp.shutdown()`` in its
``__del__``, with every forward it served, and nothing after. The OTLP export interval is ten
minutes, so no periodic export runs during the test: every export received is a replica's final one.

Ray is not in the test environment (it is a large framework with pins of its own): the app runs
under a driver (``ray_serve_driver.py``) in the interpreter named by ``MEMPROF_TEST_RAY_PYTHON``
(``scripts/install-and-test.sh`` builds ``.venv-serve`` with ``ray[serve]``, layered on ``.venv``'s torch, and sets it),
with this repository on ``PYTHONPATH``. Without the variable the module is skipped, saying so.

References independent of our code: which replica answered each HTTP request (the replica says so
in its reply, from Serve's replica context), the target files Serve's replicas write and remove,
Prometheus's own PromQL answers, and the OTLP requests decoded with the official protobufs."""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.support.demo_process import REPO, free_port_block
from tests.integration.support.otlp_receiver import OtlpReceiver, attrs, points_of
from tests.integration.support.prom_server import free_port, running_prometheus

RAY_PYTHON = os.environ.get("MEMPROF_TEST_RAY_PYTHON")
if not RAY_PYTHON:
    pytest.skip("MEMPROF_TEST_RAY_PYTHON is not set (the interpreter with ray[serve] that "
                "scripts/install-and-test.sh builds as .venv-serve)", allow_module_level=True)
# the test command may still be building it: the tests wait (tests/framework_venvs.py)
pytestmark = pytest.mark.framework_venv("serve")

DRIVER = "tests/integration/support/ray_serve_driver.py"
PEAK = "memprof_layer_peak_increase_bytes"
LAYERS = {"", "0", "1", "2"}  # the example's nn.Sequential: the root and its three modules
DEPLOYMENT, APP, MODEL = "MemprofModel", "default", "mlp"
READY = re.compile(r"REPLICA_READY replica=(\S+) full_id=(\S+) port=(\d+) pid=(\d+)")
STOPPED = re.compile(r"REPLICA_STOPPED replica=(\S+) flushed=(\S+)")
# no periodic OTLP export within the test: what arrives comes from a replica's mp.shutdown()
INTERVAL_MS = 600_000


class Driver:
    """The driver process in a session of its own; every output line kept (and in ``log``)."""

    def __init__(self, env: dict[str, str], args: list[str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen([RAY_PYTHON, DRIVER, *args], cwd=REPO, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._new: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("a") as f:
            for line in self.proc.stdout:
                f.write(line)
                f.flush()
                self.lines.append(line)
                self._new.put(line)

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def wait_for(self, pattern: re.Pattern[str] | str, n: int = 1, timeout: float = 90.0) -> list[re.Match[str]]:
        """The first ``n`` lines (seen so far or to come) that match ``pattern``."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            found = [m for line in list(self.lines) if (m := rx.search(line))]
            if len(found) >= n:
                return found[:n]
            if self.proc.poll() is not None and self._new.empty():
                raise AssertionError(f"the driver exited ({self.proc.returncode}) before {n} x {rx.pattern!r}:\n"
                                     f"{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(found)} of {n} x {rx.pattern!r} within {timeout} s:\n{self.tail()}")
            try:
                self._new.get(timeout=0.2)
            except queue.Empty:
                pass

    def tail(self) -> str:
        return "".join(self.lines[-60:])

    def stop(self) -> None:
        """``stop`` on stdin (serve.shutdown(), ray.shutdown()), then SIGTERM, then SIGKILL to the
        process group this test started (the driver and the Ray processes it spawned)."""
        if self.proc.poll() is None:
            try:
                self.send("stop")
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(2)


def _post(port: int, batch: int) -> dict:
    body = json.dumps({"x": [[0.01 * i] * 8 for i in range(batch)]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - the local Serve proxy
        return json.loads(r.read())


def _exports_by_instance(receiver: OtlpReceiver) -> dict[str, list[dict]]:
    """service.instance.id -> the resource of each metrics export from it, with its layer peaks
    (``{layer: model}``) under ``"layers"`` and the root layer's forward count under ``"forwards"``,
    in arrival order."""
    out: dict[str, list[dict]] = {}
    for req in receiver.got("/v1/metrics"):
        for rm in req.resource_metrics:
            res = attrs(rm.resource.attributes)
            metrics = [m for sm in rm.scope_metrics for m in sm.metrics]
            layers = {attrs(p.attributes)["layer"]: attrs(p.attributes)["model"]
                      for m in metrics if m.name == "memprof.layer.peak_increase" for p in points_of(m)}
            forwards = [p.count for m in metrics if m.name == "memprof.layer.forward" for p in points_of(m)
                        if attrs(p.attributes)["layer"] == "" and attrs(p.attributes)["model"] == MODEL]
            out.setdefault(str(res.get("service.instance.id")), []).append(
                {**res, "layers": layers, "forwards": forwards})
    return out


def _until(what: str, check, timeout: float = 60.0, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(every)


def _check_final_exports(exports: dict[str, list[dict]], expected: dict[str, str], served: Counter[str]) -> None:
    """Exactly one export from each stopped replica (full id -> replica id), none from anyone else;
    its resource names the replica, and it carries the model's layers and every forward it served."""
    assert {k: len(v) for k, v in exports.items()} == {full: 1 for full in expected}, \
        {k: len(v) for k, v in exports.items()}
    for full, rid in expected.items():
        [res] = exports[full]
        assert (res["ray.serve.app"], res["ray.serve.deployment"], res["ray.serve.replica_id"]) == \
            (APP, DEPLOYMENT, rid), res
        assert res["service.name"] == "memprof-otel"
        assert res["layers"] == {layer: MODEL for layer in LAYERS}, res
        assert res["forwards"] == [served[rid]], (res["forwards"], served)


@pytest.mark.timeout(300)
def test_two_serve_replicas_push_and_serve_their_own_series_and_a_stopped_one_ends(tmp_path: Path) -> None:
    receiver = OtlpReceiver()
    sd_dir = tmp_path / "file_sd"
    sd_dir.mkdir()
    serve_port, metrics_base = free_port(), free_port_block(4)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MEMPROF_OTEL_", "RAY_"))}
    env.update({"PYTHONPATH": str(REPO), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                "OTEL_METRIC_EXPORT_INTERVAL": str(INTERVAL_MS), "OTEL_TRACES_EXPORTER": "none",
                "MEMPROF_OTEL_HTTP_PORT": str(metrics_base), "MEMPROF_OTEL_HTTP_PORT_COUNT": "4",
                "MEMPROF_OTEL_SAMPLER_INTERVAL": "0.2", "OMP_NUM_THREADS": "1",
                # every forward attributed (by default attribution keeps within an overhead budget)
                "MEMPROF_OTEL_ATTRIBUTION_OVERHEAD_BUDGET": "1.0",
                "RAY_DEDUP_LOGS": "0", "RAY_USAGE_STATS_ENABLED": "0"})
    driver = None
    try:
        with running_prometheus([], tmp_path, file_sd=[str(sd_dir / "*.json")]) as prom:
            driver = Driver(env, ["--http-port", str(serve_port), "--file-sd-dir", str(sd_dir)],
                            tmp_path / "driver.log")
            driver.wait_for("DRIVER_READY", timeout=150)
            ready = {m.group(1): (m.group(2), int(m.group(3))) for m in driver.wait_for(READY, 2)}
            assert len(ready) == 2, ready
            # each replica took a port of its own from the range, and wrote a target file naming it
            ports = {port for _, port in ready.values()}
            assert len(ports) == 2 and ports <= set(range(metrics_base, metrics_base + 4)), ready
            for rid, (full_id, port) in ready.items():
                assert full_id == f"SERVE_REPLICA::{APP}#{DEPLOYMENT}#{rid}"
                [entry] = json.loads((sd_dir / f"{DEPLOYMENT}-{rid}.json").read_text())
                assert entry == {"targets": [f"127.0.0.1:{port}"],
                                 "labels": {"ray_serve_app": APP, "ray_serve_deployment": DEPLOYMENT,
                                            "ray_serve_replica": rid}}

            # requests over HTTP through Serve's proxy until both replicas have served some
            served: Counter[str] = Counter()
            for i in range(300):
                reply = _post(serve_port, batch=4 + i % 3)
                assert len(reply["y"]) == 4 + i % 3 and all(len(row) == 4 for row in reply["y"])
                served[reply["replica"]] += 1
                if i >= 20 and min(served[r] for r in ready) >= 3:
                    break
            assert set(served) == set(ready) and min(served.values()) >= 3, served

            assert not receiver.got("/v1/metrics"), "an OTLP export before any replica stopped"

            # Prometheus: each replica's layers, from its own target, told apart by the target labels
            for rid, (_, port) in ready.items():
                rows = prom.query_until(f'count({PEAK}{{model="{MODEL}", ray_serve_replica="{rid}"}}) == 4',
                                        timeout=60, what=f"replica {rid}'s layer series")
                rows = prom.query(f'{PEAK}{{model="{MODEL}", ray_serve_replica="{rid}"}}')
                assert {r["metric"].get("layer", "") for r in rows} == LAYERS  # Prometheus drops an empty label
                assert {(r["metric"]["instance"], r["metric"]["ray_serve_deployment"], r["metric"]["ray_serve_app"])
                        for r in rows} == {(f"127.0.0.1:{port}", DEPLOYMENT, APP)}
            # instrumented once per replica, whatever the number of calls: the root layer counted each
            # forward of that replica once (the forwards it served, no more, no fewer)
            seen: list[dict[str, float]] = []

            def counts() -> bool:
                seen.append({r["metric"]["ray_serve_replica"]: float(r["value"][1]) for r in prom.query(
                    f'memprof_layer_forward_seconds_count{{model="{MODEL}", layer=""}}')})
                return seen[-1] == {r: float(n) for r, n in served.items()}
            try:
                _until("root-layer forward counts equal to the requests each replica served", counts, timeout=30)
            except AssertionError as e:
                raise AssertionError(f"{e}: served {dict(served)}, counted {seen[-1]}") from None

            # scale down to one replica: the other stops (Serve calls its __del__)
            driver.send("scale 1")
            driver.wait_for("SCALED 1", timeout=90)
            [stopped_line] = driver.wait_for(STOPPED, 1, timeout=60)
            gone, flushed = stopped_line.group(1), stopped_line.group(2)
            assert gone in ready and flushed == "True", stopped_line.group(0)
            [kept] = set(ready) - {gone}
            gone_full, kept_full = ready[gone][0], ready[kept][0]
            assert not (sd_dir / f"{DEPLOYMENT}-{gone}.json").exists(), "the stopped replica's target file is left"
            assert (sd_dir / f"{DEPLOYMENT}-{kept}.json").exists()

            # OTLP: one export from the stopped replica, its final one: under its own identity, with its
            # layers and every forward it served; none from the kept replica (it has not stopped)
            full = {gone_full: gone, kept_full: kept}
            exports = _until("the stopped replica's final export", lambda: _exports_by_instance(receiver) or None,
                             timeout=10)
            _check_final_exports(exports, {gone_full: gone}, served)

            # Prometheus: the stopped replica's series are stale now — an instant query no longer finds
            # them, though their last samples are seconds old (marked stale by the first scrape that
            # failed, or when the target left the file_sd files, whichever came first) — and its
            # target is dropped (its `up` too goes stale once the target file is gone)
            _until(f"replica {gone}'s series stale", lambda: not prom.query(
                f'{PEAK}{{ray_serve_replica="{gone}"}}') or None, timeout=30)
            _until(f"replica {gone}'s target dropped", lambda: not prom.query(
                f'up{{ray_serve_replica="{gone}"}}') or None, timeout=30)
            assert prom.query(f'last_over_time({PEAK}{{ray_serve_replica="{gone}"}}[5m])'), \
                "the stopped replica's series were never stored"
            rows = prom.query(f'{PEAK}{{model="{MODEL}", ray_serve_replica=~".+"}}')
            assert {r["metric"]["ray_serve_replica"] for r in rows} == {kept}
            assert {t["labels"].get("ray_serve_replica") for t in prom.targets()} == {kept}
            last = _post(serve_port, batch=2)  # the kept replica still serves
            assert last["replica"] == kept, last
            served[kept] += 1
            # stop Serve: the kept replica's __del__ removes its target file too
            driver.send("stop")
            driver.wait_for("^STOPPED", timeout=90)
            assert driver.proc.wait(timeout=60) == 0, driver.tail()
            assert not list(sd_dir.glob("*.json")), list(sd_dir.iterdir())
            # its final export: now both replicas have sent one each, told apart by their identities
            _check_final_exports(_exports_by_instance(receiver), full, served)
    finally:
        if driver is not None:
            driver.stop()
        receiver.close()
