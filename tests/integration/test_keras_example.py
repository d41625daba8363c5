"""``examples/keras_server.py`` run for real on the TensorFlow backend: the app answers and refuses
bad input, a real Prometheus scraping the memprof endpoint sees every Keras layer path and the
predict operations, ``/v1/layers`` lists the paths, a dump over HTTP captures a forward, and
SIGTERM ends it cleanly.

TensorFlow is not in the test environment (it pins its own numpy and protobuf): the example runs
under the interpreter named by ``MEMPROF_TEST_TF_PYTHON`` (``scripts/install-and-test.sh`` builds
``.venv-tf`` with ``tensorflow-cpu`` and sets it), which has no torch: running there also shows the
example needs none. Without the variable the module is skipped, saying so.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.support.demo_process import REPO
from tests.integration.support.prom_server import free_port, running_prometheus
from tests.schemas import validate_speedscope

TF_PYTHON = os.environ.get("MEMPROF_TEST_TF_PYTHON")
if not TF_PYTHON:
    pytest.skip("MEMPROF_TEST_TF_PYTHON is not set (the interpreter with tensorflow-cpu that "
                "scripts/install-and-test.sh builds as .venv-tf)", allow_module_level=True)
# the test command may still be building it: the tests wait (tests/framework_venvs.py)
pytestmark = pytest.mark.framework_venv("tf")

EXAMPLE = Path(REPO) / "examples" / "keras_server.py"
MODEL = "keras-mlp"
WIDTH, CLASSES = 256, 10
# written from the model's definition in the example (InputLayer left out; "" is the model)
PATHS = {"", "encoder", "block", "block.fc1", "block.act", "block.fc2", "head"}
INNERMOST = {"encoder", "block.fc1", "block.act", "block.fc2", "head"}
READY_TIMEOUT_S = 120.0  # importing TensorFlow takes seconds, more on a loaded machine


class Example:
    """The example as a child process; its stdout and stderr go to files (never a full pipe)."""

    def __init__(self, tmp_path: Path) -> None:
        self.port, self.app_port = free_port(), free_port()
        while self.app_port == self.port:
            self.app_port = free_port()
        self.out_path, self.err_path = tmp_path / "example.out", tmp_path / "example.err"
        env = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [str(TF_PYTHON), str(EXAMPLE), "--port", str(self.port), "--app-port", str(self.app_port),
                 "--every-forward"], cwd=REPO, env=env, stdout=out, stderr=err)
        self.app_url = f"http://127.0.0.1:{self.app_port}"
        self.memprof_url = f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return (f"--- stdout\n{self.out_path.read_text(errors='replace')[-3000:]}\n"
                f"--- stderr\n{self.err_path.read_text(errors='replace')[-4000:]}")

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.out_path.read_text(errors="replace").splitlines():
                if line.startswith("ready "):
                    return line
            if self.proc.poll() is not None:
                raise AssertionError(f"the example exited with {self.proc.returncode} before ready\n{self.logs()}")
            time.sleep(0.2)
        raise AssertionError(f"no ready line within {timeout} s\n{self.logs()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def batch(rng: random.Random, rows: int) -> dict[str, Any]:
    return {"inputs": [[rng.uniform(-1.0, 1.0) for _ in range(WIDTH)] for _ in range(rows)]}


def check_prediction(resp: httpx.Response, rows: int) -> None:
    assert resp.status_code == 200, resp.text[:500]
    outputs = resp.json()["outputs"]
    assert len(outputs) == rows and {len(o) for o in outputs} == {CLASSES}
    assert all(abs(sum(o) - 1.0) < 1e-3 for o in outputs)  # the softmax head: class probabilities


@pytest.mark.timeout(300)
def test_the_keras_example_serves_predictions_and_exports_every_layer(tmp_path: Path) -> None:
    ex = Example(tmp_path)
    try:
        # GIVEN the example on the TensorFlow backend, every forward attributed
        ready = ex.wait_ready()
        assert f"app={ex.app_url}" in ready and f"memprof={ex.memprof_url}" in ready, ready
        rng = random.Random(7)
        with httpx.Client(base_url=ex.app_url, timeout=60.0) as app, \
                httpx.Client(base_url=ex.memprof_url, timeout=60.0) as memprof:
            assert app.get("/healthz").status_code == 200

            # WHEN real batches are posted, THEN one probability row per input row
            sizes = [64, 128, 1, 200]
            for rows in sizes:
                check_prediction(app.post("/predict", json=batch(rng, rows)), rows)

            # AND bad input gets a 400 with a JSON error body, never a crash
            bad = {
                "bad_json": b"{not json",
                "bad_width": json.dumps({"inputs": [[0.5] * (WIDTH - 1)]}).encode(),
                "too_many_rows": json.dumps({"inputs": [[0.0] * WIDTH] * 1025}).encode(),
                "bad_value": json.dumps({"inputs": [["1.0"] * WIDTH]}).encode(),
                "bad_inputs": json.dumps({"inputs": []}).encode(),
            }
            for error, body in bad.items():
                r = app.post("/predict", content=body, headers={"Content-Type": "application/json"})
                assert r.status_code == 400, (error, r.status_code, r.text[:300])
                doc = r.json()
                assert doc["error"] == error and isinstance(doc["detail"], str) and doc["detail"], doc
            assert app.get("/healthz").status_code == 200
            check_prediction(app.post("/predict", json=batch(rng, 64)), 64)
            predicted = len(sizes) + 1  # refused requests are not predict operations

            # THEN a real Prometheus sees every layer path and counts the predict operations
            with running_prometheus([f"127.0.0.1:{ex.port}"], tmp_path) as prom:
                series = prom.query_until(f'memprof_layer_peak_increase_bytes{{model="{MODEL}"}}', timeout=60)
                # Prometheus drops an empty label: the model's own series ("") has no layer label
                assert {s["metric"].get("layer", "") for s in series} == PATHS, series
                assert {s["metric"]["device"] for s in series} == {"cpu"}
                figures = {s["metric"].get("layer", ""): float(s["value"][1]) for s in series}
                # float32 activations: block.fc1's output at 64 rows and more is at least 1 MiB
                assert figures["block.fc1"] >= 1 << 20, figures
                count = prom.query_until(f'memprof_operation_duration_seconds_count{{operation="predict"}} == {predicted}',
                                         timeout=60, what="the predict operations counted")
                assert len(count) == 1, count

            # AND /v1/layers lists the same paths for the model
            layers = memprof.get("/v1/layers").json()["models"][MODEL]
            assert set(layers["layers"]) == PATHS
            assert all(s["calls"] >= predicted for s in layers["layers"].values()), layers

            # AND a dump asked over HTTP while requests flow captures a forward
            stop = threading.Event()

            def send() -> None:
                with httpx.Client(base_url=ex.app_url, timeout=60.0) as client:
                    while not stop.is_set():
                        client.post("/predict", json=batch(random.Random(1), 64))
                        stop.wait(0.05)

            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            try:
                r = memprof.post(f"/v1/dumps?model={MODEL}&wait=30", headers={"Content-Type": "application/json"})
            finally:
                stop.set()
                sender.join(60)
            assert r.status_code == 200, r.text[:1000]
            job = r.json()
            assert job["status"] == "complete" and job["dump"]["kind"] == "speedscope", job
            doc = memprof.get(job["dump"]["url"]).json()  # a path on the endpoint
            validate_speedscope(doc)
            names = {f["name"] for f in doc["shared"]["frames"]}
            assert INNERMOST <= names, names
            assert app.get("/healthz").status_code == 200

        # AND SIGTERM ends it cleanly
        ex.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        code = ex.proc.wait(20)
        assert code == 0, ex.logs()
        assert time.monotonic() - t0 < 20
    finally:
        ex.kill()
