"""The HTTP endpoint, end to end: a real server on port 0 hit with a real client, every route of
the route table in docs/reference.md and every error case; then the same routes mounted through
WSGI and ASGI."""
from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import torch

import memprof_otel as mp
from tests import reference_doc, schemas
from tests.integration.support.helpers import JSON_HEADERS, Traffic, scrape_values, wait_until

from .support.models import F32, Tree

EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}
RSS = "memprof_process_resident_memory_bytes"
BODY_CAP = 1024


pytestmark = pytest.mark.timeout(60)  # a server that hangs fails the test, not the run

# ---- helpers --------------------------------------------------------------------------------

def assert_error(r: httpx.Response, status: int, error: str | None = None) -> dict[str, Any]:
    """A JSON error: the status, ``{"error", "detail"}`` as non-empty strings, no traceback."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    assert "Traceback" not in r.text
    body = r.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("detail"), str) and body["detail"], body
    if error is not None:
        assert body["error"] == error, body
    return body


def config(tmp_path: Path, **http: Any) -> dict[str, Any]:
    return {"sampler": {"interval": "50ms"}, "dumps": {"dir": str(tmp_path / "dumps")},
            "http": {"max_body_bytes": f"{BODY_CAP}B", **http}}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[mp.Server]:
    mp.start_monitoring(config(tmp_path))
    srv = mp.serve(port=0)
    assert srv.port != 0 and srv.url == f"http://127.0.0.1:{srv.port}"
    yield srv
    srv.close()


@pytest.fixture
def tree() -> tuple[Tree, mp.Instrumentation]:
    model = Tree()
    return model, mp.instrument(model, name="tree", **EVERY)


@pytest.fixture(scope="module")
def speedscope_validator() -> jsonschema.Draft7Validator:
    return schemas.speedscope_validator()


# ---- /metrics, /healthz, /v1/status ---------------------------------------------------------

def test_metrics_text_and_openmetrics_content_types(client, tree):
    model, _ = tree
    model(torch.randn(4, 8))
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'memprof_layer_peak_increase_bytes{device="cpu",layer="a",model="tree"}' in r.text
    assert not r.text.rstrip().endswith("# EOF")

    om = client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert om.status_code == 200
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")  # OpenMetrics' mandatory terminator
    assert "# TYPE memprof_build info" in om.text

    head = client.head("/metrics")
    assert head.status_code == 200 and head.content == b""


def test_healthz_ok_while_sampling_then_503_after_stop(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    mp.stop_monitoring()
    body = assert_error(client.get("/healthz"), 503)
    assert body["status"] == "down" and "sampler" in body["reason"]


def test_status_reports_version_models_sources_and_config(client, tree, tmp_path):
    model, _ = tree
    for _ in range(3):
        model(torch.randn(4, 8))
    st = wait_until(lambda: (s := client.get("/v1/status").json())["sampler"]["ticks"] >= 3 and s,
                    what="three sampler ticks")
    assert st["version"] == mp.__version__
    assert st["torch_version"] == torch.__version__
    [m] = [m for m in st["models"] if m["name"] == "tree"]
    assert m["layers"] == len(list(model.named_modules()))
    assert m["forwards"] == 3 and m["attributed_forwards"] == 3
    assert m["device"] == "cpu" and m["paused"] is False and m["hook_errors"] == 0
    assert st["sampler"]["running"] is True and st["sampler"]["interval_seconds"] == pytest.approx(0.05)
    assert st["config"]["dumps"]["dir"] == str(tmp_path / "dumps")
    assert st["config"]["http"]["max_body_bytes"] == BODY_CAP
    assert st["sources"]["process"]["up"] is True
    # the same up/down view as memprof_source_up
    up = {dict(k)["source"]: v for k, v in scrape_values(client, "memprof_source_up").items()}
    assert {k: (1.0 if v["up"] else 0.0) for k, v in st["sources"].items()} == up


# ---- /v1/layers, /v1/timeline ---------------------------------------------------------------

def test_layers_for_one_model_all_models_and_unknown_model(client, tree):
    model, h = tree
    other = Tree()
    mp.instrument(other, name="other", **EVERY)
    model(torch.randn(4, 8))
    body = client.get("/v1/layers", params={"model": "tree"}).json()
    assert set(body["models"]) == {"tree"}
    layers = body["models"]["tree"]["layers"]
    assert set(layers) == {p for p, _ in model.named_modules()}
    assert layers["a"]["peak_increase"] == 1000 * F32 and layers["b.1"]["peak_increase"] == 20000 * F32
    assert layers["a"]["calls"] == 1 and layers["a"]["layer_name"] == "a"
    assert body["models"]["tree"]["window"]["b.0"]["peak_increase"] == 5000 * F32
    assert set(client.get("/v1/layers").json()["models"]) == {"tree", "other"}
    detail = assert_error(client.get("/v1/layers", params={"model": "nope"}), 404, "unknown_model")["detail"]
    assert "nope" in detail


def test_timeline_since_filters_samples_and_lists_operations(client):
    with mp.operation("load", stage="test"):
        time.sleep(0.06)
    wait_until(lambda: len(client.get("/v1/timeline").json()["samples"]) >= 6, what="six samples")
    full = client.get("/v1/timeline").json()
    before = time.time()
    recent = client.get("/v1/timeline", params={"since": "0.15"}).json()
    assert recent["samples"], "samples from the last 150 ms"
    assert len(recent["samples"]) < len(full["samples"])
    assert all(s["t"] >= before - 0.15 - 0.05 for s in recent["samples"])
    assert {"t", "process", "allocators", "gpus", "operation"} <= set(full["samples"][-1])
    [op] = [o for o in full["operations"] if o["name"] == "load"]
    assert op["attributes"] == {"stage": "test"} and op["end"] - op["start"] >= 0.05


@pytest.mark.parametrize("since", ["abc", "-1", "nan", "inf", ""])
def test_timeline_rejects_bad_since(client, since):
    body = assert_error(client.get("/v1/timeline", params={"since": since}), 400, "bad_parameter")
    assert "since" in body["detail"]


# ---- watchdog rules and alerts --------------------------------------------------------------

RULE = {"name": "rss_high", "metric": RSS, "op": ">", "threshold": "20GiB", "for": "5m",
        "severity": "critical", "actions": ["log"], "labels": {}}


def test_rules_put_then_get_round_trip_normalized(client):
    assert client.get("/v1/watchdog/rules").json() == {"rules": []}
    r = client.put("/v1/watchdog/rules", json={"rules": [RULE]})
    assert r.status_code == 200, r.text
    want = {**RULE, "threshold": float(20 << 30), "for": 300.0}
    assert r.json() == {"rules": [want]}
    assert client.get("/v1/watchdog/rules").json() == {"rules": [want]}
    # a bare list is accepted too, and replaces (not appends)
    other = {"name": "cpu_busy", "metric": "memprof_process_cpu_utilization_ratio", "op": ">=", "threshold": 0.9}
    assert client.put("/v1/watchdog/rules", json=[other]).status_code == 200
    assert [x["name"] for x in client.get("/v1/watchdog/rules").json()["rules"]] == ["cpu_busy"]


def _rule(**kw: Any) -> dict[str, Any]:
    return {"name": "r", "metric": RSS, "op": ">", "threshold": 1, **kw}


@pytest.mark.parametrize("body,error,mentions", [
    (b"{not json", "bad_json", "JSON"),
    (b"", "bad_rules", "rules"),
    (b'{"rules": 5}', "bad_rules", "rules"),
    (json.dumps({"rules": [{"name": "r", "metric": RSS, "op": ">"}]}).encode(), "bad_rule", "threshold"),
    (json.dumps({"rules": [_rule(op="=>")]}).encode(), "bad_rule", "op"),
    (json.dumps({"rules": [_rule(metric="node_memory_MemTotal_bytes")]}).encode(), "bad_rule", "metric"),
    (json.dumps({"rules": [_rule(severity="page")]}).encode(), "bad_rule", "severity"),
    (json.dumps({"rules": [_rule(actions=["empty_cache"])]}).encode(), "bad_rule", "actions"),
    (json.dumps({"rules": [_rule(), _rule(threshold=2)]}).encode(), "bad_rules", "unique"),
], ids=["bad-json", "empty", "not-a-list", "missing-threshold", "bad-op", "unknown-metric-pattern",
        "bad-severity", "bad-action", "duplicate-names"])
def test_put_rules_rejects_bad_bodies_and_keeps_rules_in_force(client, body, error, mentions):
    assert client.put("/v1/watchdog/rules", json={"rules": [RULE]}).status_code == 200
    r = client.put("/v1/watchdog/rules", content=body, headers={"Content-Type": "application/json"})
    assert mentions in assert_error(r, 400, error)["detail"]
    assert [x["name"] for x in client.get("/v1/watchdog/rules").json()["rules"]] == ["rss_high"]


def test_alerts_fire_pend_and_resolve_after_put_rules(client, tree):
    model, h = tree
    model(torch.randn(4, 8))
    rules = [
        {"name": "rss_fires", "metric": RSS, "op": ">", "threshold": 1, "for": 0},
        {"name": "rss_pending", "metric": RSS, "op": ">", "threshold": 1, "for": "1h", "severity": "info"},
        {"name": "tree_alive", "metric": "memprof_overhead_seconds_total", "op": ">=", "threshold": 0,
         "labels": {"model": "tree"}},
    ]
    assert client.put("/v1/watchdog/rules", json={"rules": rules}).status_code == 200

    def states() -> dict[str, dict[str, Any]]:
        return {a["rule"]: a for a in client.get("/v1/alerts").json()["alerts"]}

    got = wait_until(lambda: len(s := states()) == 3 and s, what="three alert instances")
    assert got["rss_fires"]["state"] == "firing"
    assert got["rss_pending"]["state"] == "pending" and got["rss_pending"]["severity"] == "info"
    assert got["tree_alive"]["state"] == "firing" and got["tree_alive"]["labels"] == {"model": "tree"}
    now = time.time()
    for a in got.values():
        assert a["since"] <= now and now - a["since"] < 10
    assert got["rss_fires"]["value"] > 1 and got["rss_fires"]["threshold"] == 1.0
    active = {dict(k)["rule"]: v for k, v in scrape_values(client, "memprof_alert_active").items()}
    assert active == {"rss_fires": 1.0, "rss_pending": 0.0, "tree_alive": 1.0}
    fired = {dict(k)["rule"]: v for k, v in scrape_values(client, "memprof_watchdog_alerts_total").items()}
    assert fired == {"rss_fires": 1.0, "rss_pending": 0.0, "tree_alive": 1.0}

    h.uninstrument()  # the rule's series disappears: its alert resolves
    got = wait_until(lambda: (s := states())["tree_alive"]["state"] == "resolved" and s, what="resolved")
    assert got["rss_fires"]["state"] == "firing" and got["rss_pending"]["state"] == "pending"


# ---- dumps ----------------------------------------------------------------------------------

def _dump_job_validator(client: httpx.Client) -> jsonschema.Draft202012Validator:
    """The DumpJob schema the endpoint's /openapi.json publishes, its references resolved there."""
    spec = client.get("/openapi.json").json()
    return jsonschema.Draft202012Validator({**spec["components"]["schemas"]["DumpJob"],
                                            "components": spec["components"]})


def test_post_dump_answers_202_at_once_then_the_poll_turns_complete(client, tree, speedscope_validator):
    model, _ = tree
    job_schema = _dump_job_validator(client)
    # GIVEN no forward runs: the capture cannot finish yet
    t0 = time.monotonic()
    r = client.post("/v1/dumps", params={"kind": "speedscope", "forwards": 2, "timeout": 20, "model": "tree"})
    # THEN the answer comes at once, 202 with the request and where to poll it
    assert time.monotonic() - t0 < 2
    assert r.status_code == 202, r.text
    assert r.reason_phrase == "Accepted"  # the status line's standard phrase, not a made-up one
    job = r.json()
    job_schema.validate(job)
    assert re.fullmatch(r"job-[0-9a-f]{16}", job["id"])
    assert r.headers["location"] == f"/v1/dumps/{job['id']}" == job["url"]
    assert (job["status"], job["model"], job["forwards"], job["dump"], job["error"]) == \
        ("pending", "tree", 2, None, None)
    polled = client.get(r.headers["location"])
    assert polled.status_code == 202 and polled.json()["status"] == "pending"
    assert client.get("/v1/dumps").json() == {"dumps": []}
    # WHEN forwards run, THEN a long poll returns the completed request with its stored dump
    with Traffic(model):
        done = client.get(r.headers["location"], params={"wait": 30})
    assert done.status_code == 200, done.text
    job = done.json()
    job_schema.validate(job)
    assert job["status"] == "complete" and job["finished"] >= job["created"]
    with pytest.raises(jsonschema.ValidationError):  # the schema has teeth: complete needs its dump
        job_schema.validate({**job, "dump": None})
    info = job["dump"]
    assert re.fullmatch(r"\d{8}T\d{6}Z-tree-[0-9a-f]{8}", info["id"])
    assert info["url"] == f"/v1/dumps/{info['id']}"
    assert info["kind"] == "speedscope" and info["model"] == "tree"
    listed = client.get("/v1/dumps").json()["dumps"]
    assert [d["id"] for d in listed] == [info["id"]] and listed[0]["size_bytes"] == info["size_bytes"]
    assert "path" not in listed[0]  # the local path is not disclosed
    # AND the existing download route serves the file
    got = client.get(info["url"])
    assert got.status_code == 200 and got.headers["content-type"].startswith("application/json")
    assert len(got.content) == info["size_bytes"]
    doc = got.json()
    speedscope_validator.validate(doc)
    names = [f["name"] for f in doc["shared"]["frames"]]
    sampled, evented = doc["profiles"]
    assert sum(sampled["weights"]) == sampled["endValue"] > 0
    assert all(names[s[0]] == "tree" for s in sampled["samples"])
    root_opens = [e for e in evented["events"] if e["type"] == "O" and names[e["frame"]] == "tree"]
    assert len(root_opens) == 2  # exactly the two captured forwards


def test_post_dump_with_wait_answers_200_with_the_stored_dump(client, tree):
    model, _ = tree
    with Traffic(model):
        r = client.post("/v1/dumps", params={"forwards": 1, "timeout": 10, "wait": 30})
    assert r.status_code == 200, r.text
    job = r.json()
    _dump_job_validator(client).validate(job)
    assert job["status"] == "complete" and r.headers["location"] == f"/v1/dumps/{job['id']}"
    assert client.get(job["dump"]["url"]).json()["profiles"][0]["unit"] == "bytes"
    assert client.get(job["url"]).json() == job  # the poll says the same


def test_post_dump_with_a_short_wait_answers_202_pending(client, tree):
    t0 = time.monotonic()
    r = client.post("/v1/dumps", params={"timeout": 5, "wait": 0.3})
    assert 0.3 <= time.monotonic() - t0 < 3
    assert r.status_code == 202 and r.json()["status"] == "pending"
    # the request's capture is still armed: a second one on the model is refused at once
    assert_error(client.post("/v1/dumps", params={"timeout": 5}), 409, "capture_in_progress")
    model, _ = tree
    with Traffic(model):
        done = client.get(r.headers["location"], params={"wait": 30})
    assert done.status_code == 200 and done.json()["status"] == "complete"


@pytest.mark.parametrize("wait", ["-1", "55.5", "nan", "inf", "1e999", "abc", ""])
def test_out_of_range_wait_is_400_and_starts_nothing(client, tree, wait):
    body = assert_error(client.post("/v1/dumps", params={"timeout": 5, "wait": wait}), 400, "bad_parameter")
    assert "wait" in body["detail"] and "55" in body["detail"]
    _, h = tree
    h.capture(forwards=1).cancel()  # no capture was left armed (else: CaptureBusy)
    assert_error(client.get("/v1/dumps/job-0123456789abcdef", params={"wait": wait}), 400, "bad_parameter")


def test_unknown_request_id_is_404_json(client, tree):
    assert "job-0123456789abcdef" in assert_error(client.get("/v1/dumps/job-0123456789abcdef"), 404,
                                                  "job_not_found")["detail"]
    assert_error(client.get("/v1/dumps/job-0123"), 400, "bad_dump_id")  # neither a request's nor a dump's


def test_post_dump_409_while_another_capture_runs(client, tree):
    _, h = tree
    cap = h.capture(forwards=1)  # no traffic: it stays running
    body = assert_error(client.post("/v1/dumps", params={"timeout": 5}), 409, "capture_in_progress")
    assert "tree" in body["detail"]
    assert not cap.done


def test_post_dump_504_when_no_forward_comes_in_time(client, tree):
    t0 = time.monotonic()
    body = assert_error(client.post("/v1/dumps", params={"timeout": "0.2", "wait": 10}), 504, "no_forward_in_time")
    assert 0.2 <= time.monotonic() - t0 < 5
    assert body["status"] == "failed" and "0.2 s" in body["detail"]
    assert client.get("/v1/dumps").json() == {"dumps": []}
    # polled without wait, the same failure is the request's status: 200, failed, with the error
    pending = client.post("/v1/dumps", params={"timeout": "0.2"})
    assert pending.status_code == 202
    failed = client.get(pending.headers["location"], params={"wait": 10})
    assert failed.status_code == 200
    job = failed.json()
    _dump_job_validator(client).validate(job)
    assert (job["status"], job["error"], job["dump"]) == ("failed", "no_forward_in_time", None)
    assert "no forward of 'tree' completed" in job["detail"]
    # the timed-out capture does not block the next one
    model, _ = tree
    with Traffic(model):
        assert client.post("/v1/dumps", params={"timeout": 10, "wait": 30}).status_code == 200


@pytest.mark.parametrize("params", [
    {"kind": "pprof"}, {"forwards": "0"}, {"forwards": "abc"}, {"forwards": "1001"}, {"timeout": "-1"},
    {"timeout": "nan"}, {"timeout": "abc"},
], ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()))
def test_post_dump_rejects_bad_parameters_at_once(client, tree, params):
    t0 = time.monotonic()
    body = assert_error(client.post("/v1/dumps", params=params), 400, "bad_parameter")
    assert next(iter(params)) in body["detail"]
    assert time.monotonic() - t0 < 2  # refused before any capture started
    _, h = tree
    h.capture(forwards=1).cancel()  # and no capture was left running


def test_post_dump_unknown_model_and_missing_dump_are_404(client, tree):
    assert "nope" in assert_error(client.post("/v1/dumps", params={"model": "nope"}), 404, "unknown_model")["detail"]
    assert_error(client.get("/v1/dumps/20250101T000000Z-tree-0123abcd"), 404, "dump_not_found")


def test_post_dump_without_any_model_is_404(client):
    assert_error(client.post("/v1/dumps"), 404, "unknown_model")


@pytest.mark.parametrize("raw_id", [
    "..%2F..%2Fetc%2Fpasswd", "..%2Fsecret.json", "%2E%2E", "abc", "20250101T000000Z-tree-0123ABCD",
    "20250101T000000Z-tree-0123abcd.speedscope.json", "20250101T000000Z-tree-0123abcd%00",
])
def test_malformed_dump_ids_are_400_and_never_read_outside(server, tmp_path, raw_id):
    (tmp_path / "secret.json").write_text("TOPSECRET-CONTENT")
    (tmp_path / "dumps").mkdir()
    # raw request target: no client-side normalization of the percent-encoding
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(f"GET /v1/dumps/{raw_id} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        raw = _read_all(s)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split()[1] == b"400", raw
    assert b"TOPSECRET" not in body and b"root:" not in body and b"Traceback" not in body
    assert json.loads(body)["error"] == "bad_dump_id"


def _read_all(s: socket.socket) -> bytes:
    chunks = []
    while chunk := s.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


# ---- routing, auth, body cap ----------------------------------------------------------------

@pytest.mark.parametrize("method,path,allow", [
    ("DELETE", "/v1/watchdog/rules", "GET, PUT"), ("POST", "/metrics", "GET"), ("PUT", "/v1/dumps", "GET, POST"),
    ("POST", "/v1/dumps/20250101T000000Z-tree-0123abcd", "GET"), ("DELETE", "/v1/dumps/x", "GET"),
])
def test_wrong_method_is_405_with_allow(client, method, path, allow):
    r = client.request(method, path)
    assert_error(r, 405, "method_not_allowed")
    assert r.headers["allow"] == allow


@pytest.mark.parametrize("path", ["/", "/v2/status", "/metricsx", "/v1/dump", "/v1/watchdog"])
def test_unknown_route_is_404(client, path):
    assert_error(client.get(path), 404, "not_found")


def _token_requests(dump_url: str, job_url: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [("GET", job_url, {}),
        ("GET", "/v1/status", {}), ("GET", "/v1/layers", {}), ("GET", "/v1/timeline", {}),
        ("GET", "/v1/alerts", {}), ("GET", "/v1/watchdog/rules", {}),
        ("PUT", "/v1/watchdog/rules", {"json": {"rules": []}}),
        ("GET", "/v1/dumps", {}), ("GET", dump_url, {}), ("GET", "/openapi.json", {}),
        ("POST", "/v1/dumps", {"params": {"timeout": 10, "wait": 30}}),
    ]


def test_token_guards_every_route_but_metrics_and_healthz(tmp_path, tree):
    model, _ = tree
    mp.start_monitoring(config(tmp_path))
    srv = mp.serve(port=0, token="s3cret")
    good = {"Authorization": "Bearer s3cret"}
    bad = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer s3cret2"},
           {"Authorization": "Basic czNjcmV0"}, {"Authorization": "s3cret"}]
    with httpx.Client(base_url=srv.url, timeout=30, headers=JSON_HEADERS) as c, Traffic(model):
        for public in ("/metrics", "/healthz"):
            assert c.get(public).status_code == 200
        first = c.post("/v1/dumps", params={"timeout": 10, "wait": 30}, headers=good)
        assert first.status_code == 200, first.text
        for method, path, kw in _token_requests(first.json()["dump"]["url"], first.headers["location"]):
            for headers in bad:
                r = c.request(method, path, headers=headers, **kw)
                assert_error(r, 401, "unauthorized")
                assert r.headers["www-authenticate"].startswith("Bearer")
            ok = c.request(method, path, headers=good, **kw)
            assert ok.status_code == 200, (method, path, ok.text)
        status = c.get("/v1/status", headers=good)
        assert "s3cret" not in status.text and status.json()["config"]["http"]["token"] is None
    srv.close()


def test_non_loopback_bind_without_token_refuses_put_and_post(tmp_path, tree):
    mp.start_monitoring(config(tmp_path))
    srv = mp.serve(host="0.0.0.0", port=0)
    with httpx.Client(base_url=f"http://127.0.0.1:{srv.port}", timeout=30, headers=JSON_HEADERS) as c:
        assert "token" in assert_error(c.put("/v1/watchdog/rules", json={"rules": [RULE]}), 403, "forbidden")["detail"]
        assert_error(c.post("/v1/dumps", params={"timeout": 0.2}), 403, "forbidden")
        assert c.get("/v1/watchdog/rules").json() == {"rules": []}  # the refused PUT changed nothing
        for path in ("/metrics", "/healthz", "/v1/status", "/v1/layers", "/v1/alerts", "/v1/dumps", "/openapi.json"):
            assert c.get(path).status_code == 200, path
    srv.close()


def test_body_over_cap_is_413_before_the_body_is_read(client, server):
    # GIVEN a body announced far over the cap, of which not one byte is sent
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"PUT /v1/watchdog/rules HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 104857600\r\n\r\n")
        # THEN the answer comes at once (a server reading the body would block here until the timeout)
        raw = _read_all(s)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split()[1] == b"413", raw
    assert json.loads(body)["error"] == "body_too_large"
    # a complete body one byte over the cap is refused too; one at the cap is accepted
    padded = json.dumps({"rules": [RULE]}).encode()
    at_cap = padded + b" " * (BODY_CAP - len(padded))
    assert_error(client.put("/v1/watchdog/rules", content=at_cap + b" "), 413, "body_too_large")
    assert client.get("/v1/watchdog/rules").json() == {"rules": []}
    assert client.put("/v1/watchdog/rules", content=at_cap).status_code == 200


# ---- /v1/memory ------------------------------------------------------------------------------

def test_memory_answers_its_schema_the_parts_add_up_and_metrics_carry_the_same(client, tree):
    spec = client.get("/openapi.json").json()
    validator = jsonschema.Draft202012Validator({**spec["components"]["schemas"]["Memory"],
                                                 "components": spec["components"]})
    lin = torch.nn.Linear(64, 32)  # the tree has no parameters: a model that has weights
    h = mp.instrument(lin, name="linear")
    lin(torch.randn(2, 64))
    doc = wait_until(lambda: (d := client.get("/v1/memory").json())["devices"].get("cpu", {}).get(
        "components", {}).get("weights") and d, what="a CPU breakdown after the linear model was instrumented")
    validator.validate(doc)
    cpu = doc["devices"]["cpu"]
    assert sum(cpu["components"].values()) + cpu["unexplained_bytes"] == cpu["total_bytes"] > 0
    # the weights of every live instrumented model (earlier tests' may live on): each storage once
    from memprof_otel.attribution.live_handles import live_handles
    storages = {p.untyped_storage().data_ptr(): p.numel() * p.element_size() for h in live_handles().values()
                if h.model is not None for p in [*h.model.parameters(), *h.model.buffers()]}
    assert cpu["components"]["weights"] == sum(storages.values()) > 0
    rows = scrape_values(client, "memprof_memory_bytes")
    assert {dict(k)["component"] for k in rows if dict(k)["device"] == "cpu"} == {*cpu["components"], "unexplained"}
    assert sum(v for k, v in rows.items() if dict(k)["device"] == "cpu") > 0
    assert_error(client.get("/v1/memory", params={"x": "1"}), 400, "bad_parameter")
    h.uninstrument()


# ---- OpenAPI --------------------------------------------------------------------------------

def test_openapi_documents_exactly_the_routes_the_server_answers(client, tree):
    r = client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert re.fullmatch(r"3\.\d+\.\d+", doc["openapi"]) and doc["info"]["version"] == mp.__version__
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    router = set(mp.wsgi_app().endpoint._handlers)  # what the server built a handler for
    assert documented == router == reference_doc.documented_routes()
    for (method, path) in sorted(documented):
        op = doc["paths"][path][method.lower()]
        assert op["responses"] and op["summary"]
        for code, resp in op["responses"].items():
            if int(code) >= 400:
                assert resp["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
        assert (op.get("security") == []) == (path in ("/metrics", "/healthz"))
        # the server answers every documented route: neither "no such route" nor "wrong method"
        url = path.replace("{id}", "20250101T000000Z-tree-0123abcd")
        kw: dict[str, Any] = {"params": {"timeout": "0.05"}} if method == "POST" else {}
        if method == "PUT":
            kw = {"json": {"rules": []}}
        got = client.request(method, url, **kw)
        assert got.status_code != 405
        assert got.status_code != 404 or got.json()["error"] != "not_found", (method, path)
    assert set(doc["components"]["schemas"]["Error"]["required"]) == {"error", "detail"}


# ---- WSGI and ASGI mounts -------------------------------------------------------------------

def test_wsgi_app_answers_metrics_healthz_and_json_errors(tmp_path):
    mp.start_monitoring(config(tmp_path))
    app = mp.wsgi_app()
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://127.0.0.1", headers=JSON_HEADERS) as c:
        m = c.get("/metrics")
        assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
        assert "memprof_build_info" in m.text
        assert c.get("/healthz").json() == {"status": "ok"}
        assert_error(c.get("/v1/nope"), 404, "not_found")
        assert_error(c.put("/v1/watchdog/rules", content=b"x" * (BODY_CAP + 1)), 413, "body_too_large")
    # mounted without a bind address: mutating routes only from loopback clients
    remote = httpx.WSGITransport(app=app, remote_addr="10.1.2.3")
    with httpx.Client(transport=remote, base_url="http://127.0.0.1", headers=JSON_HEADERS) as c:
        assert_error(c.put("/v1/watchdog/rules", json={"rules": []}), 403, "forbidden")
        assert c.get("/v1/watchdog/rules").status_code == 200


def test_asgi_app_answers_metrics_healthz_and_json_errors(tmp_path):
    mp.start_monitoring(config(tmp_path))
    app = mp.asgi_app()

    async def main() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", headers=JSON_HEADERS) as c:
            om = await c.get("/metrics", headers={"Accept": "application/openmetrics-text"})
            assert om.status_code == 200 and om.headers["content-type"].startswith("application/openmetrics-text")
            assert (await c.get("/healthz")).json() == {"status": "ok"}
            assert_error(await c.get("/v1/timeline", params={"since": "nan"}), 400, "bad_parameter")
            assert_error(await c.put("/v1/watchdog/rules", content=b"x" * (BODY_CAP + 1)), 413, "body_too_large")
            ok = await c.put("/v1/watchdog/rules", json={"rules": [RULE]})
            assert ok.status_code == 200 and ok.json()["rules"][0]["name"] == "rss_high"
        remote = httpx.ASGITransport(app=app, client=("10.1.2.3", 4567))
        async with httpx.AsyncClient(transport=remote, base_url="http://127.0.0.1", headers=JSON_HEADERS) as c:
            assert_error(await c.post("/v1/dumps"), 403, "forbidden")

    asyncio.run(main())
    mp.stop_monitoring()
    r = asyncio.run(_asgi_get(app, "/healthz"))
    assert_error(r, 503, "sampler_down")


async def _asgi_get(app: Any, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", headers=JSON_HEADERS) as c:
        return await c.get(path)


def test_unexpected_failure_is_json_500_without_traceback(client, monkeypatch):
    from memprof_otel.runtime import runtime

    def broken() -> list[Any]:
        raise KeyError("internal detail")

    monkeypatch.setattr(runtime().watchdog, "alerts", broken)
    body = assert_error(client.get("/v1/alerts"), 500, "internal")
    assert "KeyError" in body["detail"] and "internal detail" not in body["detail"]
    assert client.get("/healthz").status_code == 200  # the server keeps serving


def test_serve_refuses_a_taken_port_and_bad_arguments_with_typed_errors(tmp_path):
    # GIVEN a port already taken by another server
    mp.start_monitoring({"sampler": {"interval": "50ms"}, "dumps": {"dir": str(tmp_path / "dumps")}})
    first = mp.serve(port=0)
    try:
        # WHEN/THEN a second server on it, or nonsense arguments, raise typed errors naming the problem
        with pytest.raises(mp.ServeError, match=f"127.0.0.1:{first.port}"):
            mp.serve(port=first.port)
        with pytest.raises(mp.ConfigError) as bad_port:
            mp.serve(port=70000)
        assert bad_port.value.key == "http.port"
        with pytest.raises(mp.ConfigError):
            mp.serve(host="")
        # AND the first server still answers
        assert httpx.get(first.url + "/healthz", timeout=10).status_code == 200
    finally:
        first.close()
