"""Shared test helpers: ``Traffic`` (forwards on a background thread, a busy server), ``wait_until``
``scrape_values`` (one family's samples in a scrape of the endpoint) and ``collector_paused``."""
from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families
from torch import nn

import memprof_otel as mp

# What a well-behaved API client sends: PUT/POST without a JSON content type are refused (415).
JSON_HEADERS = {"Content-Type": "application/json"}


class Traffic:
    """``op``: run each forward inside ``mp.operation(op)``. Errors raised by forwards (and
    non-finite outputs: a corrupted tensor) fail the block when it ends."""

    def __init__(self, model: nn.Module, op: str | None = None, period: float = 0.005,
                 x: torch.Tensor | None = None) -> None:
        self.model, self.op, self.period = model, op, period
        self.x = torch.randn(4, 8) if x is None else x
        self._stop = threading.Event()
        self.forwards = 0
        self.errors: list[BaseException] = []
        self._t = threading.Thread(target=self._run, name="test-traffic", daemon=True)

    def _forward(self) -> None:
        out = self.model(self.x)
        if isinstance(out, torch.Tensor) and out.is_floating_point() and not torch.isfinite(out).all():
            raise AssertionError("non-finite output")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.op:
                    with mp.operation(self.op):
                        self._forward()
                else:
                    self._forward()
                self.forwards += 1
            except BaseException as e:  # noqa: BLE001 - reported by the test
                self.errors.append(e)
            self._stop.wait(self.period)

    def __enter__(self) -> "Traffic":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(10)
        assert not self.errors, self.errors


def wait_until(pred: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns something truthy (returned); AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (v := pred()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
    return v


def wait_for(pred: Any, timeout: float = 10.0, step: float = 0.02) -> bool:
    """Poll ``pred`` until it is true or ``timeout`` passes; its last answer, as a bool."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def scrape_values(client: httpx.Client, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples named ``name`` in a scrape of /metrics (which must answer 200): sorted label items -> value."""
    r = client.get("/metrics")
    assert r.status_code == 200, (r.status_code, r.text[:300])
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Collect the cyclic garbage earlier code left, then keep the collector off while the block runs.

    A collection starts whenever some thread's allocations cross a threshold (the sampler's ticks
    count too), and frees whatever cycles are pending then: megabytes after a matplotlib figure, say.
    Inside the block every free happens by reference count, where the code does it, so figures
    read there (RSS deltas, per-layer bytes) do not depend on when a collection happens to run."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def error_detail(r: httpx.Response, status: int, error: str) -> str:
    """Assert an endpoint error: ``status``, a JSON body ``{"error": error, "detail": ...}``; the detail."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error", "detail"} and body["error"] == error and body["detail"], body
    return body["detail"]


# The next process of a service, as a restart starts it: it starts monitoring (which scans the black
# box folder), waits for the scan, and prints GET /v1/postmortem's document
_NEXT_PROCESS = ("import json, memprof_otel as mp\n"
                 "from memprof_otel.runtime import runtime\n"
                 "mp.start_monitoring()\n"
                 "print(json.dumps(runtime().blackbox.document(30.0)))\n"
                 "mp.shutdown()\n")


def next_process_postmortems(python: str, env: dict[str, str], cwd: str | None = None) -> dict[str, Any]:
    """What the next process of the service (same ``env``: its name and black box folder) serves."""
    import json
    import subprocess
    out = subprocess.run([python, "-c", _NEXT_PROCESS], env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
