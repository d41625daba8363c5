"""The endpoint against careless and hostile input, over real sockets: bodies shorter than their
Content-Length, query parameters a route does not take, a format on a request id, stored dumps
written broken into a shared dump folder, ids that are not UTF-8, over-long or with a date that
does not exist."""
from __future__ import annotations

import gzip
import json
import os
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

import memprof_otel as mp
from memprof_otel.http.routes import ROUTES

from .support.models import Tree

pytestmark = pytest.mark.timeout(120)

RSS = "memprof_process_resident_memory_bytes"
RULE = {"name": "rss_high", "metric": RSS, "op": ">", "threshold": "20GiB"}
DUMP_ID = "20250101T000000Z-tree-0123abcd"


def assert_json_error(r: httpx.Response, status: int, error: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert body["error"] == error and isinstance(body["detail"], str) and body["detail"], body
    return body


# ---- a body shorter than its Content-Length ----------------------------------------------------

def half_closed_exchange(port: int, head: bytes, body: bytes) -> tuple[int, dict[str, Any]]:
    """Send ``head`` (announcing more bytes than ``body``) and ``body``, close our sending side, read
    the answer until the server closes: (status, JSON body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + body)
        s.shutdown(socket.SHUT_WR)
        answer = b"".join(iter(lambda: s.recv(65536), b""))
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def test_a_short_post_dump_body_is_400_and_captures_nothing(server, client):
    h = mp.instrument(Tree(), name="tree")
    head = (b"POST /v1/dumps?timeout=5 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n")
    status, body = half_closed_exchange(server.port, head, b"{}")
    assert (status, body["error"]) == (400, "body_incomplete"), body
    h.capture(forwards=1).cancel()  # CaptureBusy if the short request had started one
    assert client.get("/v1/dumps").json() == {"dumps": []}


def test_a_short_put_rules_body_is_400_and_changes_no_rule(server, client):
    text = json.dumps({"rules": [RULE]}).encode()  # a complete JSON document, shorter than announced
    head = (b"PUT /v1/watchdog/rules HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (len(text) + 50))
    status, body = half_closed_exchange(server.port, head, text)
    assert (status, body["error"]) == (400, "body_incomplete"), body
    assert client.get("/v1/watchdog/rules").json() == {"rules": []}
    assert client.put("/v1/watchdog/rules", content=text).status_code == 200  # the same body in full


# ---- query parameters a route does not take ---------------------------------------------------

def test_post_dump_with_a_typo_parameter_is_400_naming_it_and_captures_nothing(client):
    h = mp.instrument(Tree(), name="tree")
    body = assert_json_error(client.post("/v1/dumps", params={"forward": "5", "timeout": "5"}), 400,
                             "bad_parameter")
    assert "'forward'" in body["detail"] and "forwards" in body["detail"], body
    h.capture(forwards=1).cancel()  # CaptureBusy if the refused request had started one
    assert client.get("/v1/dumps").json() == {"dumps": []}


@pytest.mark.parametrize("method,path,params", [
    ("GET", "/v1/layers", {"modle": "tree"}), ("GET", "/v1/timeline", {"limt": "5"}),
    ("GET", "/v1/leaks", {"tpo": "3"}), ("GET", "/v1/advice", {"min_severty": "warning"}),
    ("GET", "/v1/status", {"verbose": "1"}), ("GET", "/v1/alerts", {"state": "firing"}),
    ("GET", "/v1/watchdog/rules", {"x": "1"}), ("GET", "/v1/dumps", {"model": "tree"}),
    ("GET", f"/v1/dumps/{DUMP_ID}", {"fromat": "pprof"}), ("GET", "/v1/dumps/job-0123456789abcdef", {"wiat": "1"}),
])
def test_unknown_query_parameters_are_400_naming_them(client, method, path, params):
    name = next(iter(params))
    r = client.request(method, path, params=params)
    assert repr(name) in assert_json_error(r, 400, "bad_parameter")["detail"]
    assert len(r.content) < 1000


def test_put_rules_with_a_query_parameter_is_400_and_changes_nothing(client):
    r = client.put("/v1/watchdog/rules", params={"merge": "1"}, json={"rules": [RULE]})
    assert "'merge'" in assert_json_error(r, 400, "bad_parameter")["detail"]
    assert client.get("/v1/watchdog/rules").json() == {"rules": []}


def test_documented_query_parameters_are_exactly_those_taken_and_the_400_is_documented(client):
    """Every documented parameter of a checked route is taken (none is refused as unknown), every
    taken one is documented, and each checked route lists its 400."""
    doc = client.get("/openapi.json").json()
    for route in ROUTES:
        if route.query is None:
            continue
        op = doc["paths"][route.path][route.method.lower()]
        documented = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
        assert documented == route.query, (route.method, route.path)
        assert "400" in op["responses"], (route.method, route.path)
        for name in route.query:  # taken by the router: whatever the handler makes of its value
            r = client.request(route.method, route.path.replace("{id}", "job-0123456789abcdef"),
                               params={name: "x"}, json={"rules": []} if route.method == "PUT" else None)
            assert "unknown query parameter" not in r.text, (route.method, route.path, name)
    # routes that take any query: scrapers, probes, cache-busters
    for path in ("/metrics", "/healthz", "/openapi.json"):
        assert client.get(path, params={"_": "123"}).status_code == 200, path
    assert "/v1/dumps/{id}" in doc["paths"]


def test_documented_parameters_still_work(client):
    mp.instrument(Tree(), name="tree")
    assert client.get("/v1/layers", params={"model": "tree"}).status_code == 200
    assert client.get("/v1/timeline", params={"since": "10", "limit": "5"}).status_code == 200
    assert client.get("/v1/leaks", params={"top": "3"}).status_code == 200
    assert client.get("/v1/advice", params={"model": "tree", "min_severity": "warning"}).status_code == 200
    assert client.get("/v1/headroom", params={"model": "tree", "batch": "2"}).status_code == 200


# ---- a format on a request id ----------------------------------------------------------------

def test_a_format_on_a_request_id_is_400_saying_formats_apply_to_dump_ids(client):
    h = mp.instrument(Tree(), name="tree")
    r = client.post("/v1/dumps", params={"timeout": "0.05"})
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    for fmt in ("pprof", "speedscope"):
        detail = assert_json_error(client.get(f"/v1/dumps/{job}", params={"format": fmt}), 400,
                                   "bad_parameter")["detail"]
        assert "dump id" in detail, detail
    assert client.get(f"/v1/dumps/{job}", params={"wait": "10"}).status_code == 200  # without format: the job
    h.capture(forwards=1).cancel()


# ---- stored dumps written broken into the folder ------------------------------------------------

def flame_doc(samples: list[Any], weights: list[Any]) -> dict[str, Any]:
    return {"$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": {"frames": [{"name": "root"}, {"name": "leaf"}]},
            "profiles": [{"type": "sampled", "name": "x", "unit": "bytes", "startValue": 0,
                          "endValue": 10, "samples": samples, "weights": weights}]}


def store_raw(tmp_path: Path, body: bytes, dump_id: str = DUMP_ID, kind: str = "speedscope") -> str:
    folder = tmp_path / "dumps"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{dump_id}.{kind}.json"
    path.write_bytes(body)
    os.chmod(path, 0o600)
    return dump_id


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,                                   # nested deeper than the parser goes
    json.dumps(flame_doc([[0, -1]], [10])).encode(),                   # -1 would wrap to the last frame
    json.dumps(flame_doc([[0, 2]], [10])).encode(),                    # past the last frame
    json.dumps(flame_doc([[0, 1]], [-5])).encode(),                    # a negative weight
    json.dumps(flame_doc([[0, 1]], [1 << 70])).encode(),               # over int64
    json.dumps(flame_doc([[0, 1]], [1.5])).encode(),                   # not an integer
    json.dumps({**flame_doc([[0, 1]], [10]), "memprof_otel": {"pprof": {
        "sample_types": [["a", "bytes"], ["b", "count"]], "more_values": [5]}}}).encode(),  # a row not a list
    b"\xff\xfe not json",
], ids=["deep", "index-1", "index-past-end", "negative-weight", "huge-weight", "float-weight", "bad-row",
        "not-json"])
def test_a_malformed_stored_dump_is_422_when_converted(tmp_path, server, client, body):
    dump_id = store_raw(tmp_path, body)
    r = client.get(f"/v1/dumps/{dump_id}", params={"format": "pprof"})
    assert "malformed" in assert_json_error(r, 422, "malformed_dump")["detail"]
    assert len(r.content) < 1000
    assert client.get("/v1/status").status_code == 200


def test_a_well_formed_stored_dump_still_converts_and_an_oom_record_is_400(tmp_path, server, client):
    dump_id = store_raw(tmp_path, json.dumps(flame_doc([[0, 1], [0]], [10, 0])).encode())
    r = client.get(f"/v1/dumps/{dump_id}", params={"format": "pprof"})
    assert r.status_code == 200 and gzip.decompress(r.content), r.text[:300]
    oom = store_raw(tmp_path, json.dumps({"type": "oom", "layer": "x"}).encode(),
                    dump_id="20250101T000001Z-tree-0123abce", kind="oom")
    assert_json_error(client.get(f"/v1/dumps/{oom}", params={"format": "pprof"}), 400, "bad_parameter")


# ---- ids in the path -----------------------------------------------------------------------------

def test_a_path_id_is_decoded_as_utf8(client):
    detail = assert_json_error(client.get("/v1/dumps/%C3%BC"), 400, "bad_dump_id")["detail"]
    assert "\u00fc" in detail and "\u00c3" not in detail, detail


def test_a_path_that_is_not_utf8_is_400(client):
    assert_json_error(client.get("/v1/dumps/%FF%FE"), 400, "bad_path")


def test_a_long_id_is_not_echoed_in_full(client):
    r = client.get("/v1/dumps/" + "x" * 20_000)
    assert_json_error(r, 400, "bad_dump_id")
    assert len(r.content) < 300, len(r.content)


@pytest.mark.parametrize("dump_id", ["20991327T999999Z-x-00000000", "20250230T000000Z-x-00000000",
                                     "20250101T240000Z-x-00000000", "20250101T000060Z-x-00000000"])
def test_an_id_with_a_date_that_does_not_exist_is_400(client, dump_id):
    assert_json_error(client.get(f"/v1/dumps/{dump_id}"), 400, "bad_dump_id")
    assert client.get(f"/v1/dumps/{DUMP_ID}").status_code == 404  # a real date, no such dump


def test_the_asgi_app_runs_nothing_on_a_short_or_abandoned_body(tmp_path):
    """The ASGI app: a body that ends before its Content-Length is a 400, a client that goes away
    mid-body gets no answer; neither changes a rule."""
    import asyncio

    mp.start_monitoring({"dumps": {"dir": str(tmp_path / "dumps")}})
    app = mp.asgi_app()
    text = json.dumps({"rules": [RULE]}).encode()

    async def call(messages: list[dict[str, Any]], length: int, method: str = "PUT") -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        feed = iter(messages)

        async def receive() -> dict[str, Any]:
            return next(feed)

        async def send(msg: dict[str, Any]) -> None:
            sent.append(msg)

        scope = {"type": "http", "method": method, "path": "/v1/watchdog/rules", "query_string": b"",
                 "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                             (b"content-length", str(length).encode())], "client": ("127.0.0.1", 1)}
        await app(scope, receive, send)
        return sent

    short = asyncio.run(call([{"type": "http.request", "body": text, "more_body": False}], len(text) + 50))
    assert short[0]["status"] == 400 and json.loads(short[1]["body"])["error"] == "body_incomplete"
    gone = asyncio.run(call([{"type": "http.request", "body": text[:5], "more_body": True},
                             {"type": "http.disconnect"}], len(text)))
    assert gone == []
    rules = asyncio.run(call([{"type": "http.request", "body": b"", "more_body": False}], 0, "GET"))
    assert json.loads(rules[1]["body"]) == {"rules": []}
    full = asyncio.run(call([{"type": "http.request", "body": text, "more_body": False}], len(text)))
    assert full[0]["status"] == 200
