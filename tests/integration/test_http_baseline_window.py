"""``POST /v1/baseline`` on a real endpoint: a measuring window attributes every forward of a model
served on the shipped defaults and answers its figures per input shape; bad input is a 4xx with a
JSON body, a window with no traffic a 504, a second window at once a 409, and the sampling is back
as configured once the window closed.

The reference is plain arithmetic on known tensor sizes: a ``Linear(16, 32)`` on a batch of ``b``
allocates its float32 output, ``b * 32 * 4`` bytes, and keeps it (its peak increase and retained
bytes); the ReLU after it allocates ``b * 32 * 4`` more; the last ``Linear(32, 4)``, ``b * 4 * 4``."""
from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

import memprof_otel as mp

pytestmark = pytest.mark.timeout(120)
BATCHES = (2, 5, 8)


@pytest.fixture
def served():
    mp.start_monitoring({"sampler": {"interval": "100ms"}})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    h = mp.instrument(model, name="mlp")  # the shipped defaults
    srv = mp.serve(port=0)
    yield srv.url, model, h
    srv.close()
    h.uninstrument()


def _traffic(model: torch.nn.Module, stop: threading.Event) -> None:
    i = 0
    with torch.inference_mode():
        while not stop.is_set():
            model(torch.randn(BATCHES[i % len(BATCHES)], 16))
            i += 1
            time.sleep(0.001)


def test_a_window_keeps_every_forward_per_shape_with_the_figures_of_plain_arithmetic(served):
    url, model, h = served
    stop = threading.Event()
    t = threading.Thread(target=_traffic, args=(model, stop))
    before = h.status()["attributed_forwards"]
    t.start()
    try:
        r = httpx.post(f"{url}/v1/baseline", json={"forwards": 30, "timeout": 30}, timeout=60)
    finally:
        stop.set()
        t.join()
    assert r.status_code == 200, r.text
    doc = r.json()
    # THEN it kept the forwards asked for, every one attributed, and said what it cost
    w = doc["window"]
    assert w["complete"] and w["forwards_kept"] == 30 and w["forwards_raised"] == 0, w
    assert w["seconds"] > 0 and w["overhead_seconds"] >= 0
    assert h.status()["attributed_forwards"] - before >= 30
    # AND per shape, each layer's figure is what the tensor sizes say, with no spread
    shapes = {s["features"]["batch"]: s for s in doc["shapes"]}
    assert set(shapes) == set(BATCHES) and sum(s["forwards"] for s in shapes.values()) == 30
    for b, s in shapes.items():
        assert s["layers"]["0"]["median"]["peak_increase_bytes"] == b * 32 * 4
        assert s["layers"]["0"]["median"]["retained_bytes"] == b * 32 * 4
        assert s["layers"]["1"]["median"]["peak_increase_bytes"] == b * 32 * 4
        assert s["layers"]["2"]["median"]["peak_increase_bytes"] == b * 4 * 4
        assert all(v == 0 for lay in s["layers"].values() for v in lay["spread"].values())
    # AND once it closed, forwards are attributed as the sampling says again (not every one)
    n0, a0 = h.status()["forwards"], h.status()["attributed_forwards"]
    with torch.inference_mode():
        for _ in range(200):
            model(torch.randn(2, 16))
    assert h.status()["attributed_forwards"] - a0 < 0.5 * (h.status()["forwards"] - n0)


def test_bad_input_no_traffic_and_a_second_window_are_refused_with_a_json_body(served):
    url, model, h = served
    for body, status, error in [({"model": None}, 400, "bad_parameter"), ({"forwards": 0}, 400, "bad_parameter"),
                                ({"timeout": 1e9}, 400, "bad_parameter"), ({"frames": 3}, 400, "bad_parameter"),
                                ({"model": "nope", "timeout": 1}, 404, "unknown_model")]:
        r = httpx.post(f"{url}/v1/baseline", json=body, timeout=30)
        assert (r.status_code, r.json()["error"]) == (status, error), (body, r.text)
    # no traffic: the window closes at its timeout, and says why
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v1/baseline", json={"timeout": 0.5}, timeout=30)
    assert r.status_code == 504 and r.json()["error"] == "no_forward_in_time", r.text
    assert time.monotonic() - t0 < 10
    # a second window while one is open
    first: list[httpx.Response] = []
    t = threading.Thread(target=lambda: first.append(httpx.post(f"{url}/v1/baseline", json={"timeout": 2}, timeout=30)))
    t.start()
    time.sleep(0.5)
    r = httpx.post(f"{url}/v1/baseline", json={"timeout": 1}, timeout=30)
    t.join()
    assert r.status_code == 409 and r.json()["error"] == "baseline_in_progress", r.text
    assert first[0].status_code == 504
