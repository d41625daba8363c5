"""The endpoint against hostile and careless clients, over real sockets: numbers that are not
finite, requests from other origins (a web page's simple POST, DNS rebinding), the OOM record under
a flood of on-demand dumps, bytes that are not HTTP, connections that time out or vanish, and paged
timeline reads."""
from __future__ import annotations

import json
import logging
import socket
import struct
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torch import nn

import memprof_otel as mp
from memprof_otel._log import RateLimitedLog
from memprof_otel.http import connection_errors, server as http_server
from memprof_otel.http.app import timeline_page
from tests.integration.support.helpers import JSON_HEADERS, Traffic, scrape_values, wait_until

from .support.models import Tree

pytestmark = pytest.mark.timeout(120)

RSS = "memprof_process_resident_memory_bytes"
GOOD_RULE = {"name": "rss_high", "metric": RSS, "op": ">", "threshold": "20GiB"}
READ_ROUTES = ("/metrics", "/healthz", "/v1/status", "/v1/layers", "/v1/timeline", "/v1/alerts",
               "/v1/watchdog/rules", "/v1/dumps", "/openapi.json")


def start(tmp_path: Path, http: dict[str, Any] | None = None, dumps: dict[str, Any] | None = None,
          host: str | None = None) -> mp.Server:
    mp.start_monitoring({"sampler": {"interval": "50ms"}, "http": http or {},
                         "dumps": {"dir": str(tmp_path / "dumps"), **(dumps or {})}})
    return mp.serve(host=host, port=0)


def assert_json_error(r: httpx.Response, status: int, error: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("detail"), str) and body["detail"], body
    if error is not None:
        assert body["error"] == error, body
    return body


def assert_reads_ok(c: httpx.Client) -> None:
    for path in READ_ROUTES:
        r = c.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        if path != "/metrics":
            r.json()  # strict JSON: no NaN/Infinity token would parse in every client


def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are, read until the server closes: (status, headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1."), raw[:300]
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, body


# ---- numbers ---------------------------------------------------------------------------------

# raw JSON text: Python's json module reads NaN / Infinity literals, as many clients write them
BAD_THRESHOLDS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", '"nan"', '"inf"', '"-inf"', '"Infinity"',
                  '"NaN"', '"1e999"', "1" + "0" * 400, '"' + "9" * 5000 + '"', '"1e999GiB"']


@pytest.mark.parametrize("threshold", BAD_THRESHOLDS, ids=lambda t: t[:12])
def test_non_finite_threshold_is_refused_and_every_read_stays_200(client, threshold):
    assert client.put("/v1/watchdog/rules", json={"rules": [GOOD_RULE]}).status_code == 200
    body = ('{"rules": [{"name": "bad", "metric": "%s", "op": ">", "threshold": %s}]}' % (RSS, threshold)).encode()
    r = client.put("/v1/watchdog/rules", content=body)
    assert "threshold" in assert_json_error(r, 400, "bad_rule")["detail"]
    assert len(r.content) < 1000  # the hostile value is not echoed back in full
    assert [x["name"] for x in client.get("/v1/watchdog/rules").json()["rules"]] == ["rss_high"]
    assert_reads_ok(client)


@pytest.mark.parametrize("field,value", [
    ("for", "NaN"), ("for", "Infinity"), ("for", "-1"), ("for", "1e999"), ("for", "1" + "0" * 400),
    ("name", '"' + "n" * 10000 + '"'), ("metric", '"memprof_' + "x" * 10000 + '"'),
    ("labels", '{"device": "' + "v" * 5000 + '"}'), ("labels", '{"bad name": "x"}'),
])
def test_other_bad_rule_fields_are_refused_by_name(client, field, value):
    rule = {"name": "r", "metric": RSS, "op": ">", "threshold": 1}
    text = json.dumps({"rules": [rule]})[:-3] + f', "{field}": {value}' + "}]}"
    detail = assert_json_error(client.put("/v1/watchdog/rules", content=text.encode()), 400, "bad_rule")["detail"]
    assert field in detail
    assert client.get("/v1/watchdog/rules").json() == {"rules": []}
    assert_reads_ok(client)


@pytest.mark.parametrize("path,params,field", [
    ("/v1/timeline", {"since": "NaN"}, "since"), ("/v1/timeline", {"since": "Infinity"}, "since"),
    ("/v1/timeline", {"since": "-Infinity"}, "since"), ("/v1/timeline", {"since": "1e999"}, "since"),
    ("/v1/timeline", {"since": "1" * 400}, "since"), ("/v1/timeline", {"since": " 1"}, "since"),
    ("/v1/timeline", {"limit": "0"}, "limit"), ("/v1/timeline", {"limit": "-5"}, "limit"),
    ("/v1/timeline", {"limit": "1e3"}, "limit"), ("/v1/timeline", {"limit": "9" * 400}, "limit"),
    ("/v1/timeline", {"cursor": "x"}, "cursor"), ("/v1/timeline", {"cursor": "nan_1"}, "cursor"),
    ("/v1/timeline", {"cursor": "1e999_1"}, "cursor"), ("/v1/timeline", {"cursor": "1_-1"}, "cursor"),
    ("/v1/layers", {"model": "m" * 10000}, "model"),
])
def test_bad_query_numbers_and_strings_are_400_naming_the_field(client, path, params, field):
    r = client.get(path, params=params)
    assert field in assert_json_error(r, 400, "bad_parameter")["detail"]
    assert len(r.content) < 1000
    assert_reads_ok(client)


@pytest.mark.parametrize("params", [{"timeout": "Infinity"}, {"timeout": "1e999"}, {"timeout": "-Infinity"},
                                    {"forwards": "1e2"}, {"forwards": "Infinity"}, {"forwards": "-1"},
                                    {"model": "m" * 5000}])
def test_post_dump_bad_numbers_refused_before_any_capture(client, params):
    model = Tree()
    h = mp.instrument(model, name="tree")
    assert_json_error(client.post("/v1/dumps", params=params), 400, "bad_parameter")
    h.capture(forwards=1).cancel()  # no capture was left running
    assert client.get("/v1/dumps").json() == {"dumps": []}
    assert_reads_ok(client)


def test_non_finite_config_thresholds_raise_config_error():
    for bad in (float("nan"), float("inf"), "-inf", "1e999", 10**400):
        with pytest.raises(mp.ConfigError) as e:
            mp.load_config({"watchdog": {"rules": [{**GOOD_RULE, "threshold": bad}]}}, environ={})
        assert e.value.key == "watchdog.rules[0].threshold"
    env = {"MEMPROF_OTEL_WATCHDOG_RULES": json.dumps([GOOD_RULE]).replace('"20GiB"', "NaN")}
    with pytest.raises(mp.ConfigError):
        mp.load_config(None, environ=env)


# ---- other origins ---------------------------------------------------------------------------

def test_cross_origin_simple_post_is_refused_and_makes_no_dump(tmp_path):
    srv = start(tmp_path)
    model = Tree()
    mp.instrument(model, name="tree")
    with httpx.Client(base_url=srv.url, timeout=30) as c, Traffic(model):
        # what a web page can send without a preflight: a form/text body, its own Origin
        for headers in ({"Origin": "http://evil.example", "Content-Type": "text/plain"},
                        {"Origin": "http://evil.example", "Content-Type": "application/x-www-form-urlencoded"},
                        {"Origin": "null", "Content-Type": "multipart/form-data; boundary=x"}):
            r = c.post("/v1/dumps", params={"timeout": 10}, headers=headers, content=b"x")
            assert r.status_code in (403, 415), r.text
            assert_json_error(r, r.status_code)
            assert "access-control-allow-origin" not in r.headers
        # a JSON body with a foreign Origin (after a preflight no listed origin passed) is refused too
        assert_json_error(c.post("/v1/dumps", params={"timeout": 10},
                                 headers={"Origin": "http://evil.example", **JSON_HEADERS}), 403, "origin_not_allowed")
        assert_json_error(c.put("/v1/watchdog/rules", json={"rules": [GOOD_RULE]},
                                headers={"Origin": "http://evil.example"}), 403, "origin_not_allowed")
        # no Origin but not JSON: 415, whatever the body
        assert_json_error(c.post("/v1/dumps", params={"timeout": 10}), 415, "unsupported_media_type")
        assert_json_error(c.put("/v1/watchdog/rules", content=json.dumps({"rules": [GOOD_RULE]}),
                                headers={"Content-Type": "text/plain"}), 415, "unsupported_media_type")
        assert c.get("/v1/dumps").json() == {"dumps": []}
        assert c.get("/v1/watchdog/rules").json() == {"rules": []}
        # the same request from a JSON client without an Origin goes through: the refusals were the guard
        ok = c.post("/v1/dumps", params={"timeout": 10, "wait": 30},
                    headers={"Content-Type": "application/json; charset=utf-8"})
        assert ok.status_code == 200, ok.text
    srv.close()


def test_listed_origin_gets_cors_answers_and_others_do_not(tmp_path):
    srv = start(tmp_path, http={"allowed_origins": ["http://tool.example:3000"]})
    with httpx.Client(base_url=srv.url, timeout=30, headers=JSON_HEADERS) as c:
        pre = c.options("/v1/watchdog/rules", headers={"Origin": "http://tool.example:3000",
                                                        "Access-Control-Request-Method": "PUT"})
        assert pre.status_code == 204, pre.text
        assert pre.headers["access-control-allow-origin"] == "http://tool.example:3000"
        assert "PUT" in pre.headers["access-control-allow-methods"]
        assert "Content-Type" in pre.headers["access-control-allow-headers"]
        put = c.put("/v1/watchdog/rules", json={"rules": [GOOD_RULE]}, headers={"Origin": "http://tool.example:3000"})
        assert put.status_code == 200 and put.headers["access-control-allow-origin"] == "http://tool.example:3000"
        bad = c.options("/v1/watchdog/rules", headers={"Origin": "http://evil.example"})
        assert_json_error(bad, 403, "origin_not_allowed")
        assert "access-control-allow-origin" not in c.get("/v1/status", headers={"Origin": "http://evil.example"}).headers
    srv.close()


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "EVIL.example.:{port}", "127.0.0.1.evil.example",
                                  "localhost.evil.example", "127.0.0.1:{port}@evil.example", "10.1.2.3", ""])
def test_rebinding_host_is_refused_on_every_route(server, host):
    host = host.format(port=server.port)
    for method, path in [("GET", p) for p in READ_ROUTES] + [("POST", "/v1/dumps"), ("PUT", "/v1/watchdog/rules")]:
        body = b"[]" if method == "PUT" else b""
        req = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
        status, headers, raw = raw_exchange(server.port, req)
        assert status == 403, (method, path, status, raw[:200])
        assert headers["content-type"].startswith("application/json")
        assert json.loads(raw)["error"] == "host_not_allowed"
    assert httpx.get(server.url + "/v1/status", timeout=10).status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "127.0.0.1", "[::1]:{port}",
                                  "127.0.0.2"])
def test_loopback_hosts_are_answered(server, host):
    req = f"GET /v1/status HTTP/1.1\r\nHost: {host.format(port=server.port)}\r\nConnection: close\r\n\r\n"
    status, _, raw = raw_exchange(server.port, req.encode())
    assert status == 200, raw[:200]


def test_configured_host_names_are_answered_and_wildcard_bind_takes_any_ip(tmp_path):
    srv = start(tmp_path, http={"allowed_hosts": "memprof.internal, app"}, host="0.0.0.0")
    try:
        for host, want in [("memprof.internal:9464", 200), ("APP", 200), ("10.1.2.3:9464", 200),
                           ("[fd00::1]:9464", 200), ("other.internal", 403), ("app.evil.example", 403)]:
            req = f"GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
            assert raw_exchange(srv.port, req)[0] == want, host
    finally:
        srv.close()


# ---- the OOM record and rotation ---------------------------------------------------------------

class _Oom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.boom = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.boom:
            torch.empty(2**62, dtype=torch.uint8)  # the CPU allocator refuses: RuntimeError
        return self.lin(x)


def test_oom_record_survives_100_on_demand_dumps(tmp_path):
    srv = start(tmp_path, dumps={"max_files": 3, "max_oom_files": 2})
    model = _Oom()
    mp.instrument(model, name="oomer")
    model.boom = True
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 8))
    model.boom = False
    with httpx.Client(base_url=srv.url, timeout=30, headers=JSON_HEADERS) as c:
        [oom] = [d for d in c.get("/v1/dumps").json()["dumps"] if d["kind"] == "oom"]
        record = c.get(oom["url"]).content
        made = []
        with Traffic(model, period=0.001):
            for _ in range(100):
                r = c.post("/v1/dumps", params={"timeout": 10, "wait": 30})
                assert r.status_code == 200, r.text
                made.append(r.json()["dump"]["id"])
        listed = c.get("/v1/dumps").json()["dumps"]
        assert [d["id"] for d in listed if d["kind"] == "oom"] == [oom["id"]]
        assert c.get(oom["url"]).content == record
        on_demand = [d["id"] for d in listed if d["kind"] != "oom"]
        assert len(on_demand) == 3 and set(on_demand) == set(made[-3:])  # rotation still bounds those
    srv.close()


# ---- bytes that are not HTTP -------------------------------------------------------------------

@pytest.mark.parametrize("data", [
    b"\x00\x01\x02garbage\r\n\r\n",
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1 extra words\r\n\r\n",
    b"GET /metrics HTTP/9.9\r\n\r\n",
    b"GET /metrics HTTP/1.x\r\n\r\n",
    b"GET /metrics\r\n",  # HTTP/0.9
    b"POST /v1/dumps\r\n",
    b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nthis is not a header\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\n continuation-first: x\r\n\r\n",
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\nX-Long: " + b"b" * 70000 + b"\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n",
    b"\r\n",
], ids=["binary", "one-word", "four-words", "http-9.9", "bad-version", "http-0.9", "http-0.9-post",
        "no-colon-header", "continuation-first", "long-request-line", "long-header", "many-headers", "empty-line"])
def test_malformed_http_gets_the_json_error_shape(server, data):
    status, headers, body = raw_exchange(server.port, data)
    assert 400 <= status < 600, (status, body[:200])
    assert headers["content-type"] == "application/json"
    doc = json.loads(body)
    assert set(doc) == {"error", "detail"} and doc["error"] and doc["detail"]
    assert b"<html" not in body.lower() and b"Traceback" not in body
    assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200  # and the server serves on


@pytest.mark.parametrize("line", [b"GET /v1/status\r\n", b"POST /v1/dumps\n"])
def test_an_http_0_9_request_is_answered_at_once_though_the_client_keeps_the_connection_open(server, line):
    # an HTTP/0.9 client sends the request line alone and waits: no header block follows
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(line)
        t0 = time.monotonic()
        raw = b""
        while chunk := s.recv(65536):  # the server answers, then closes
            raw += chunk
    assert time.monotonic() - t0 < 3
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 505 ") and json.loads(body)["error"]


def test_a_silent_client_does_not_hold_the_server(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as idle:
        idle.sendall(b"PUT /v1/watchdog/rules HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n{")
        t0 = time.monotonic()
        assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
        assert time.monotonic() - t0 < 5


# ---- connections that fail ------------------------------------------------------------------

CONNECTION_ERRORS = "memprof_http_connection_errors_total"
IDLE, RESET, GONE = 200, 100, 100  # connections of each kind in the crowd
SHORT_TIMEOUT_S = 1.0  # the server's socket timeout here (60 s in production)


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A socket timeout the test can wait for, and a fresh log limiter: what the connection
    errors log is then exactly what this test's connections made it log."""
    monkeypatch.setattr(http_server._QuietHandler, "timeout", SHORT_TIMEOUT_S)
    monkeypatch.setattr(connection_errors, "_log", RateLimitedLog(period_s=connection_errors.LOG_PERIOD_S))


def failed_connections(c: httpx.Client) -> dict[str, float]:
    """reason -> count, from a scrape (which must answer 200)."""
    return {dict(k)["reason"]: v for k, v in scrape_values(c, CONNECTION_ERRORS).items()}


def growth(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {reason: n - before.get(reason, 0.0) for reason, n in after.items()}


def reset_mid_request(port: int) -> None:
    """Half a request line, then a reset (SO_LINGER 0: close sends RST, not FIN)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0")
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def close_before_answer(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")


def connection_log(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if CONNECTION_ERRORS in r.getMessage()]


def test_failed_connections_are_counted_by_reason_and_never_print_a_traceback(server, short_timeout, capfd,
                                                                              caplog):
    caplog.set_level(logging.INFO, logger="memprof_otel")
    with httpx.Client(base_url=server.url, timeout=30) as c:
        before = failed_connections(c)
        for _ in range(GONE):
            close_before_answer(server.port)
        for _ in range(RESET):
            reset_mid_request(server.port)
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(IDLE)]
        try:
            assert failed_connections(c)  # a scrape among the idle crowd: 200, the family in it
            wait_until(lambda: growth(before, failed_connections(c))["timeout"] >= IDLE, timeout=30,
                       what="every idle connection to time out")
        finally:
            for s in idle:
                s.close()
        grew = growth(before, failed_connections(c))  # and the scrape after it answers 200 as well
    assert grew["timeout"] == IDLE  # each idle connection counted once
    assert grew["internal"] == 0
    # Every reset one fails on the server's read. One that closed before the answer fails on the
    # write that follows the client's close, which on loopback is nearly always; any of them may
    # see the write fail as a reset or as a broken pipe.
    vanished = grew["reset"] + grew["broken_pipe"] + grew["other"]
    assert grew["reset"] >= RESET and RESET + 1 <= vanished <= RESET + GONE, grew
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err[:2000]
    lines = connection_log(caplog)  # the first failure: every later one inside LOG_PERIOD_S is only counted
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]


def test_a_body_that_stops_arriving_is_answered_and_counted_once(server, short_timeout, capfd):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        before = failed_connections(c)
        req = (b"PUT /v1/watchdog/rules HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: 100\r\n\r\n{")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(req)  # and no more: the server's read times out, the client is still listening
            answer = b"".join(iter(lambda: s.recv(65536), b""))
        assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request"), answer[:300]
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"] == "body_incomplete"
        grew = wait_until(lambda: (g := growth(before, failed_connections(c)))["timeout"] and g, what="the count")
        time.sleep(0.2)
        assert growth(before, failed_connections(c)) == grew
    assert grew == {"timeout": 1, "reset": 0, "broken_pipe": 0, "other": 0, "internal": 0}
    assert "Traceback" not in capfd.readouterr().err


def test_a_failure_of_our_own_code_is_answered_500_counted_and_logged_with_its_traceback(
        server, short_timeout, capfd, caplog):
    def broken(endpoint: Any, environ: dict[str, Any]) -> Any:
        raise RuntimeError("a bug in the transport")

    caplog.set_level(logging.INFO, logger="memprof_otel")
    with httpx.Client(base_url=server.url, timeout=30) as c:
        before = failed_connections(c)
        with pytest.MonkeyPatch.context() as patch:  # the scrapes go through the real code
            patch.setattr(http_server, "_wsgi_response", broken)
            assert_json_error(c.get("/healthz"), 500, "internal")
        grew = wait_until(lambda: (g := growth(before, failed_connections(c)))["internal"] and g, what="the count")
    assert grew == {"timeout": 0, "reset": 0, "broken_pipe": 0, "other": 0, "internal": 1}
    # the server's thread counts, then logs: the scrape may see the count first (seen on a busy machine)
    [line] = wait_until(lambda: connection_log(caplog), what="the log line")
    assert line.exc_info is not None and "a bug in the transport" in str(line.exc_info[1])
    assert "Traceback" not in capfd.readouterr().err  # logged through logging, not printed


# ---- timeline pages ---------------------------------------------------------------------------

def test_timeline_pages_together_equal_one_big_read(client):
    for i in range(7):
        with mp.operation(f"op{i}"):
            time.sleep(0.01)
    wait_until(lambda: len(client.get("/v1/timeline").json()["samples"]) >= 7, what="seven samples")
    whole = client.get("/v1/timeline", params={"limit": 5000}).json()
    assert whole["next"] is None
    samples, ops, pages = [], [], 0
    params: dict[str, Any] = {"limit": 2}
    while True:
        page = client.get("/v1/timeline", params=params).json()
        assert len(page["samples"]) <= 2 and len(page["operations"]) <= 2
        samples += page["samples"]
        ops += page["operations"]
        pages += 1
        if page["next"] is None:
            break
        params = {"limit": 2, "cursor": page["next"]}
    assert pages >= 4
    assert [o["id"] for o in ops] == [o["id"] for o in whole["operations"]]
    got_t = [s["t"] for s in samples]
    assert got_t == sorted(got_t) and len(set(got_t)) == len(got_t)
    assert got_t[:len(whole["samples"])] == [s["t"] for s in whole["samples"]]  # more may have come since
    # resume: nothing is repeated, newer samples come later
    later = client.get("/v1/timeline", params={"cursor": page["resume"]}).json()
    assert all(s["t"] > got_t[-1] for s in later["samples"]) and later["operations"] == []


def test_timeline_page_stays_within_its_byte_budget():
    class Item:
        def __init__(self, i: int) -> None:
            self.t, self.id = 1000.0 + i, i + 1

        def to_dict(self) -> dict[str, Any]:
            return {"t": self.t, "id": self.id, "pad": "x" * 1000, "bad": float("nan")}

    items = [Item(i) for i in range(500)]
    body = timeline_page(items, items, (0.0, 0), 5000, 64 << 10)
    page = json.loads(body)  # strict JSON: NaN became null
    assert len(body) < (64 << 10) + 4096
    assert 0 < len(page["samples"]) < 500 and page["next"] is not None
    assert page["samples"][0]["bad"] is None
    one = json.loads(timeline_page(items, [], (0.0, 0), 5000, 10))
    assert len(one["samples"]) == 1  # a page always moves forward
