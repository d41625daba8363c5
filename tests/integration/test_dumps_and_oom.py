"""Dumps checked to the byte against a model whose allocations we choose; rotation, watchdog
dumps and their rate limit, dump counters; the OOM flight recorder on a real CPU allocator failure;
a dump folder that cannot be written."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from torch import nn

import memprof_otel as mp
from tests.integration.support.helpers import JSON_HEADERS, Traffic, wait_until
from memprof_otel.attribution.torch import hooks
from memprof_otel.runtime import runtime
from tests.schemas import speedscope_validator

EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}
RSS = "memprof_process_resident_memory_bytes"
EMPTY = "aten::empty.memory_format"
N_A, N_B0, N_B1 = 123_457, 654_321, 1 << 20  # bytes each layer allocates per forward


class Alloc(nn.Module):
    """Allocates exactly ``nbytes`` (one uint8 tensor), frees it, returns its input unchanged."""

    def __init__(self, nbytes: int) -> None:
        super().__init__()
        self.nbytes = nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buf = torch.empty(self.nbytes, dtype=torch.uint8)
        del buf
        return x


class Known(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Alloc(N_A)
        self.b = nn.Sequential(Alloc(N_B0), Alloc(N_B1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


KNOWN_STACKS = {("known", "a", EMPTY): N_A, ("known", "b", "b.0", EMPTY): N_B0, ("known", "b", "b.1", EMPTY): N_B1}


class OomLayer(nn.Module):
    """With ``boom`` set, asks the real CPU allocator for 4 EiB and keeps the exception it raised."""

    def __init__(self) -> None:
        super().__init__()
        self.boom = False
        self.raised: BaseException | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.boom:
            try:
                torch.empty(2**62, dtype=torch.uint8)
            except RuntimeError as e:
                self.raised = e
                raise
        return x * 2


class OomModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.mid = OomLayer()
        self.post = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.mid(self.pre(x)))


pytestmark = pytest.mark.timeout(60)  # a server that hangs fails the test, not the run

# ---- helpers --------------------------------------------------------------------------------

def start(tmp_path: Path, dumps: dict[str, Any] | None = None, **sections: Any) -> tuple[mp.Server, httpx.Client]:
    mp.start_monitoring({"sampler": {"interval": "50ms"},
                         "dumps": {"dir": str(tmp_path / "dumps"), **(dumps or {})}, **sections})
    srv = mp.serve(port=0)
    return srv, httpx.Client(base_url=srv.url, timeout=60, headers=JSON_HEADERS)


@pytest.fixture
def validator() -> jsonschema.Draft7Validator:
    return speedscope_validator()


def counter(client: httpx.Client, name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def dumps_total(client: httpx.Client) -> dict[tuple[str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            if s.name == "memprof_dumps_total":
                out[(s.labels["format"], s.labels["result"])] = s.value
    return out


def delta(after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)
            if after.get(k, 0) != before.get(k, 0)}


def stacks(doc: dict[str, Any]) -> dict[tuple[str, ...], int]:
    names = [f["name"] for f in doc["shared"]["frames"]]
    prof = doc["profiles"][0]
    return {tuple(names[i] for i in s): w for s, w in zip(prof["samples"], prof["weights"])}


# ---- dump contents --------------------------------------------------------------------------

def test_http_dump_attributes_exactly_the_known_allocations(tmp_path, validator):
    srv, c = start(tmp_path)
    model = Known()
    mp.instrument(model, name="known")
    with Traffic(model):
        r = c.post("/v1/dumps", params={"forwards": 3, "timeout": 10, "wait": 30})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "complete"
    doc = c.get(r.json()["dump"]["url"]).json()
    validator.validate(doc)
    assert stacks(doc) == {k: 3 * v for k, v in KNOWN_STACKS.items()}
    assert doc["profiles"][0]["endValue"] == 3 * (N_A + N_B0 + N_B1)
    assert doc["profiles"][0]["unit"] == "bytes"


def test_export_speedscope_writes_the_last_capture(tmp_path, validator):
    model = Known()
    h = mp.instrument(model, name="known", overhead_budget=0.0)  # only the capture attributes
    cap = h.capture(forwards=2)
    x = torch.randn(4, 8)
    model(x)
    model(x)
    assert cap.wait(5)
    model(x)  # after the capture: not in it
    path = tmp_path / "known.speedscope.json"
    h.export_speedscope(str(path))
    doc = json.loads(path.read_text())
    validator.validate(doc)
    assert doc == cap.speedscope()
    assert stacks(doc) == {k: 2 * v for k, v in KNOWN_STACKS.items()}
    assert cap.total_bytes() == 2 * (N_A + N_B0 + N_B1)
    ev = doc["profiles"][1]
    frames = [f["name"] for f in doc["shared"]["frames"]]
    assert [frames[e["frame"]] for e in ev["events"] if e["type"] == "O"] == ["known", "a", "b", "b.0", "b.1"] * 2


def test_rotation_keeps_the_newest_max_files(tmp_path):
    srv, c = start(tmp_path, {"max_files": 2})
    model = Known()
    mp.instrument(model, name="known")
    ids = []
    with Traffic(model):
        for _ in range(3):
            r = c.post("/v1/dumps", params={"timeout": 10, "wait": 30})
            assert r.status_code == 200, r.text
            ids.append(r.json()["dump"]["id"])
    listed = [d["id"] for d in c.get("/v1/dumps").json()["dumps"]]
    assert listed == [ids[2], ids[1]]  # newest first
    assert c.get(f"/v1/dumps/{ids[0]}").status_code == 404
    assert len(list((tmp_path / "dumps").glob("*.json"))) == 2
    for i in ids[1:]:
        assert c.get(f"/v1/dumps/{i}").status_code == 200


# ---- counters and the watchdog's dump action ------------------------------------------------

def test_dumps_total_counts_ok_timeout_and_busy(tmp_path):
    srv, c = start(tmp_path)
    model = Known()
    h = mp.instrument(model, name="known")
    before = dumps_total(c)
    with Traffic(model):
        assert c.post("/v1/dumps", params={"timeout": 10, "wait": 30}).status_code == 200
    assert c.post("/v1/dumps", params={"timeout": 0.2, "wait": 30}).status_code == 504
    cap = h.capture(forwards=1)
    assert c.post("/v1/dumps", params={"timeout": 5}).status_code == 409
    cap.cancel()
    assert delta(dumps_total(c), before) == {("speedscope", "ok"): 1, ("speedscope", "timeout"): 1,
                                             ("speedscope", "busy"): 1}


def _rule(name: str) -> dict[str, Any]:
    return {"name": name, "metric": RSS, "op": ">", "threshold": 1, "actions": ["dump"]}


def test_watchdog_dump_action_stores_a_dump(tmp_path, validator):
    model = Known()
    mp.instrument(model, name="known")  # live before the rule can fire: the action dumps live models
    srv, c = start(tmp_path, watchdog={"dump_min_interval": 0})
    before = dumps_total(c)
    assert c.put("/v1/watchdog/rules", json={"rules": [_rule("rss_dump")]}).status_code == 200
    with Traffic(model):
        [d] = wait_until(lambda: c.get("/v1/dumps").json()["dumps"], what="the alert's dump")
    assert d["model"] == "known" and d["kind"] == "speedscope"
    doc = c.get(d["url"]).json()
    validator.validate(doc)
    assert stacks(doc) == KNOWN_STACKS  # one forward captured
    assert delta(dumps_total(c), before) == {("speedscope", "ok"): 1}
    assert c.get("/v1/alerts").json()["alerts"][0]["state"] == "firing"


def test_second_firing_inside_dump_min_interval_is_rate_limited(tmp_path):
    # two rules start firing on the same tick; only the first may dump within the hour
    model = Known()
    mp.instrument(model, name="known")
    srv, c = start(tmp_path, watchdog={"dump_min_interval": "1h"})
    before = dumps_total(c)
    assert c.put("/v1/watchdog/rules", json={"rules": [_rule("first"), _rule("second")]}).status_code == 200
    with Traffic(model):
        wait_until(lambda: c.get("/v1/dumps").json()["dumps"], what="the first alert's dump")
        wait_until(lambda: delta(dumps_total(c), before).get(("speedscope", "ok")), what="the ok count")
        time.sleep(0.3)  # several more ticks: both rules stay firing, no new firing, no new dump
    assert {a["rule"]: a["state"] for a in c.get("/v1/alerts").json()["alerts"]} == {"first": "firing",
                                                                                     "second": "firing"}
    assert len(c.get("/v1/dumps").json()["dumps"]) == 1
    assert delta(dumps_total(c), before) == {("speedscope", "ok"): 1, ("speedscope", "rate_limited"): 1}


# ---- OOM flight recorder --------------------------------------------------------------------

def test_oom_in_a_layer_is_recorded_and_reraised_unchanged(tmp_path):
    srv, c = start(tmp_path)
    model = OomModel()
    h = mp.instrument(model, name="oomer", **EVERY)
    x = torch.randn(4, 8)
    expected = torch.relu(model.pre(x) * 2)
    assert torch.equal(model(x), expected)
    wait_until(lambda: len(c.get("/v1/timeline").json()["samples"]) >= 3, what="samples before the OOM")
    ooms_before = counter(c, "memprof_allocator_ooms_total", device="cpu")
    dumps_before = dumps_total(c)

    # WHEN the middle layer's allocation fails in the real CPU allocator
    model.mid.boom = True
    with pytest.raises(RuntimeError) as ei:
        model(x)
    # THEN the caller gets the very exception the allocator raised, unchanged
    assert ei.value is model.mid.raised and type(ei.value) is RuntimeError
    assert "can't allocate memory" in str(ei.value)
    assert any(e.name == "forward" and e.frame.f_locals.get("self") is model.mid for e in ei.traceback)
    # AND it is counted and a flight record names the layer
    assert counter(c, "memprof_allocator_ooms_total", device="cpu") == ooms_before + 1
    assert delta(dumps_total(c), dumps_before) == {("oom", "ok"): 1}
    [d] = [d for d in c.get("/v1/dumps").json()["dumps"] if d["kind"] == "oom"]
    assert d["model"] == "oomer"
    rec = c.get(d["url"]).json()
    assert rec["kind"] == "oom" and rec["failing_layer"] == "mid" and rec["device"] == "cpu"
    assert "can't allocate memory" in rec["exception"]
    assert len(rec["samples"]) >= 3 and all(s["process"]["resident_memory_bytes"] > 0 for s in rec["samples"])
    assert rec["samples"][-1]["t"] <= rec["time"]
    assert set(rec["layer_stats"]) >= {"", "pre"}
    # where the memory went at the last tick before it: the parts add up to the process's RSS then
    cpu = rec["memory"]["devices"]["cpu"]
    assert cpu["total_source"] == "rss" and cpu["total_bytes"] > 0
    assert sum(cpu["components"].values()) + cpu["unexplained_bytes"] == cpu["total_bytes"]

    # AND the model keeps working, with no attribution state left behind
    assert hooks.active_sink() is None and torch._C._len_torch_dispatch_stack() == 0
    model.mid.boom = False
    calls = h.layer_stats()["mid"].calls
    assert torch.equal(model(x), expected)
    assert h.layer_stats()["mid"].calls == calls + 1
    assert h.layer_stats()["pre"].peak_increase > 0
    assert counter(c, "memprof_allocator_ooms_total", device="cpu") == ooms_before + 1


def test_unwritable_dump_dir_is_507_and_counted_and_inference_unaffected(tmp_path):
    blocker = tmp_path / "a-regular-file"
    blocker.write_text("not a directory")
    mp.start_monitoring({"sampler": {"interval": "50ms"}, "dumps": {"dir": str(blocker / "dumps")}})
    srv = mp.serve(port=0)
    c = httpx.Client(base_url=srv.url, timeout=60, headers=JSON_HEADERS)
    model = Known()
    mp.instrument(model, name="known")
    before = dumps_total(c)
    with Traffic(model) as traffic:
        r = c.post("/v1/dumps", params={"timeout": 10, "wait": 30})
        x = torch.randn(4, 8)
        assert model(x) is x  # forwards go on while and after the dump fails
    assert r.status_code == 507
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["error"] == "dump_not_stored" and body["detail"] and "Traceback" not in r.text
    assert not traffic.errors
    assert delta(dumps_total(c), before) == {("speedscope", "error"): 1}
    assert c.get("/v1/dumps").json() == {"dumps": []}
    assert blocker.read_text() == "not a directory"


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")
def test_the_default_dump_folder_opened_to_others_is_neither_listed_nor_served(tmp_path):
    mp.start_monitoring({"sampler": {"interval": "50ms"}})  # dumps.dir unset: the private default folder
    srv = mp.serve(port=0)
    c = httpx.Client(base_url=srv.url, timeout=60, headers=JSON_HEADERS)
    model = Known()
    mp.instrument(model, name="known")
    with Traffic(model):
        r = c.post("/v1/dumps", params={"timeout": 10, "wait": 30})
    assert r.status_code == 200, r.text
    dump_id = r.json()["dump"]["id"]
    folder = runtime().dump_service.store.dir
    try:
        folder.chmod(0o777)  # a folder anyone may now write files into, for us to serve as ours
        for path in ("/v1/dumps", f"/v1/dumps/{dump_id}"):
            r = c.get(path)
            assert r.status_code == 503 and r.headers["content-type"].startswith("application/json"), path
            assert r.json()["error"] == "dump_folder_unusable" and "not a private folder" in r.json()["detail"]
    finally:
        folder.chmod(0o700)
    assert c.get(f"/v1/dumps/{dump_id}").status_code == 200


def test_shutdown_ends_a_dump_request_waiting_for_forwards_and_its_long_poll_answers_at_once():
    mp.start_monitoring({"sampler": {"interval": "50ms"}})
    srv = mp.serve(port=0)
    mp.instrument(Known(), name="known")  # no forward will come
    answer: dict[str, Any] = {}

    def long_poll() -> None:
        r = httpx.post(srv.url + "/v1/dumps", params={"timeout": 30, "wait": 20}, headers=JSON_HEADERS, timeout=60)
        answer.update(status=r.status_code, body=r.json(), at=time.monotonic())

    poller = threading.Thread(target=long_poll)
    poller.start()
    wait_until(lambda: len(runtime().dump_service.jobs) > 0, what="the request pending")
    time.sleep(0.2)  # the long poll is waiting
    t0 = time.monotonic()
    assert mp.shutdown(5)
    poller.join(10)
    assert answer["at"] - t0 < 3  # answered at shutdown, not at its wait (20 s)
    assert answer["status"] == 503 and answer["body"]["status"] == "failed"
    assert answer["body"]["error"] == "shutting_down" and "shutting down" in answer["body"]["detail"]
