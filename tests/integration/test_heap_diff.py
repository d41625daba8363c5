"""Python heap diffs end to end: ``POST /v1/heap`` on a real endpoint while serving code grows a dict
on a background thread at a line we know (read from this file's source, not written down), and the
``memprof-otel heap`` command run as a subprocess against that endpoint."""
from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

import memprof_otel as mp
from memprof_otel.runtime import runtime
from tests.integration.support.demo_process import REPO, free_ports
from tests.integration.support.helpers import JSON_HEADERS, error_detail, wait_until
from tests.schemas import validate_speedscope

pytestmark = pytest.mark.timeout(120)

BUFFER = 4096
TOKEN = "heap-s3cret"


class Grower:
    """Serving code that keeps what it makes: a dict gains one 4 KiB buffer every millisecond."""

    def __init__(self) -> None:
        self.store: dict[int, bytearray] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="test-grower", daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            self.store[i] = bytearray(BUFFER)  # the growth the heap diff must find
            i += 1
            self._stop.wait(0.001)

    def __enter__(self) -> "Grower":
        self._t.start()
        wait_until(lambda: len(self.store) > 10, what="the grower to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(10)


def _grow_site() -> str:
    """``file:line`` of the line in ``Grower._run`` that stores a new buffer, as tracemalloc names it."""
    lines, first = inspect.getsourcelines(Grower._run)
    (offset,) = [i for i, text in enumerate(lines) if "bytearray(BUFFER)" in text]
    return f"{Grower._run.__code__.co_filename}:{first + offset}"


GROW_SITE = _grow_site()


@pytest.fixture(autouse=True)
def no_tracing_left() -> Iterator[None]:
    assert not tracemalloc.is_tracing()
    yield
    if tracemalloc.is_tracing():
        tracemalloc.stop()
        pytest.fail("tracemalloc was left tracing")


def heap(c: httpx.Client, body: Any = None, **kw: Any) -> httpx.Response:
    return c.post("/v1/heap", json={"seconds": 1} if body is None else body, timeout=70, **kw)



def heap_counts(c: httpx.Client) -> dict[str, float]:
    """``memprof_dumps_total{format="heap"}`` by result, as scraped (the counter lives as long as the process)."""
    out = {}
    for fam in text_string_to_metric_families(c.get("/metrics").text):
        for s in fam.samples:
            if s.name == "memprof_dumps_total" and s.labels["format"] == "heap":
                out[s.labels["result"]] = s.value
    return out


def grew(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


# ---- the diff finds the growth -------------------------------------------------------------

def test_the_growing_line_is_the_top_site_and_the_files_validate(client):
    # GIVEN serving code that grows a dict
    counted = heap_counts(client)
    with Grower() as g:
        n0 = len(g.store)
        # WHEN the endpoint traces the heap for 2 s
        r = heap(client, {"seconds": 2, "top": 5})
        n1 = len(g.store)
    # THEN its top growing site is that line, and the growth fits the buffers added meanwhile
    assert r.status_code == 200, r.text
    doc = r.json()
    doc_schema = client.get("/openapi.json").json()
    jsonschema.Draft202012Validator({"$ref": "#/components/schemas/HeapDiff",
                                     "components": doc_schema["components"]}).validate(doc)
    top = doc["sites"][0]
    assert top["site"] == GROW_SITE, [s["site"] for s in doc["sites"]]
    assert top["traceback"][-1] == {"file": GROW_SITE.rsplit(":", 1)[0], "line": int(GROW_SITE.rsplit(":", 1)[1])}
    added = n1 - n0
    assert 20 * BUFFER <= top["size_diff_bytes"] <= added * (BUFFER + 200) + 64 * n1, (top, added)
    assert top["count_diff"] >= 20 and doc["growth_bytes"] >= top["size_diff_bytes"]
    assert len(doc["sites"]) <= 5 and not doc["tracing_was_on"] and doc["frames"] == 4
    assert 2.0 <= doc["elapsed_seconds"] < 10 and not doc["stopped_early"]
    assert not tracemalloc.is_tracing()
    # the stored speedscope file of the growth is a valid speedscope file whose heaviest stack ends there
    dump = doc["dump"]
    assert dump["kind"] == "heap" and dump["url"] == f"/v1/dumps/{dump['id']}"
    sc = client.get(dump["url"]).json()
    validate_speedscope(sc)
    prof = sc["profiles"][0]
    heaviest = prof["samples"][max(range(len(prof["weights"])), key=prof["weights"].__getitem__)]
    assert sc["shared"]["frames"][heaviest[-1]]["name"] == GROW_SITE
    assert dump["id"] in {d["id"] for d in client.get("/v1/dumps").json()["dumps"]}
    assert grew(counted, heap_counts(client)) == {"ok": 1}


PACKAGE_DIR = os.path.dirname(os.path.abspath(mp.__file__))


def _ours(frame: dict[str, Any]) -> bool:
    return os.path.abspath(frame["file"]).startswith(PACKAGE_DIR + os.sep)


KEPT: list[Any] = []  # what the application below keeps (cleared by the test)


@pytest.mark.parametrize("frames", [4, 40])
def test_memprof_threads_are_left_out_and_application_code_run_through_memprof_is_kept(client, frames):
    # GIVEN memprof-otel's own threads busy (the fixture's 50 ms sampler, this endpoint) and
    # application code that grows the heap through a memprof-otel wrapper (an operation decorator
    # around a stdlib call: the allocating frames are the json package's, the caller's is ours)
    parsed = mp.operation("parse")(json.loads)
    stop = threading.Event()
    text = json.dumps({str(i): [i, str(i)] for i in range(200)})

    def app() -> None:
        while not stop.is_set():
            KEPT.append(parsed(text))
            stop.wait(0.01)

    t = threading.Thread(target=app, name="test-app", daemon=True)
    t.start()
    try:
        # WHEN the heap is traced for 2 s, deep tracebacks (40 frames) or the default 4
        r = heap(client, {"seconds": 2, "top": 100, "frames": frames})
        # (a scrape meanwhile makes the endpoint's threads allocate too)
        client.get("/metrics")
    finally:
        stop.set()
        t.join(10)
        KEPT.clear()
    assert r.status_code == 200, r.text
    doc = r.json()
    sc = client.get(doc["dump"]["url"]).json()
    names = [f["name"] for f in sc["shared"]["frames"]]
    stacks = [[names[i] for i in stack] for stack in sc["profiles"][0]["samples"]]
    # THEN no growing stack starts in a thread of memprof-otel's (seen whole with 40 frames: the
    # thread's own entry frames, threading.py then our package), and no stack has our package's
    # frames except the decorator's wrapper under application code
    for stack in stacks:
        files = [name.rsplit(":", 1)[0] for name in stack if ":" in name]
        ours = [f for f in files if _ours({"file": f})]
        assert not ours or all(f.endswith(os.path.join("memprof_otel", "api.py")) for f in ours), stack
    # and the application's growth through the wrapper is there, stdlib frames on top of ours
    through_wrapper = [s for s in stacks if any(n.startswith(os.path.join(PACKAGE_DIR, "api.py")) for n in s)
                       and any("json" + os.sep in n for n in s)]
    assert through_wrapper, stacks[:10]


def test_a_dict_that_stopped_growing_is_not_reported(client):
    # GIVEN the same code, which grew a dict and then stopped
    with Grower() as g:
        time.sleep(0.2)
    assert len(g.store) > 10
    # WHEN the heap is traced
    r = heap(client)
    # THEN that line is nowhere in the answer
    assert r.status_code == 200, r.text
    assert GROW_SITE not in {s["site"] for s in r.json()["sites"]}
    assert not tracemalloc.is_tracing()


def test_a_process_that_traces_keeps_tracing_with_its_own_frame_limit(client):
    tracemalloc.start(5)
    try:
        with Grower():
            r = heap(client, {"seconds": 1, "frames": 50})
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["tracing_was_on"] and doc["frames"] == 5
        assert doc["sites"][0]["site"] == GROW_SITE
        assert tracemalloc.is_tracing() and tracemalloc.get_traceback_limit() == 5
    finally:
        tracemalloc.stop()


# ---- one at a time, never left running -------------------------------------------------------

def test_a_second_request_while_one_runs_is_409(client, server):
    counted = heap_counts(client)
    answers: list[httpx.Response] = []
    t = threading.Thread(target=lambda: answers.append(heap(httpx.Client(base_url=server.url, headers=JSON_HEADERS),
                                                            {"seconds": 3})))
    t.start()
    wait_until(lambda: runtime().heap.running, what="the first heap diff to start")
    assert "already running" in error_detail(heap(client), 409, "heap_diff_in_progress")
    t.join(30)
    assert answers[0].status_code == 200, answers[0].text
    assert not tracemalloc.is_tracing()
    assert grew(counted, heap_counts(client)) == {"busy": 1, "ok": 1}


def test_shutdown_ends_a_running_diff_and_its_tracing(server):
    answers: list[httpx.Response] = []
    with httpx.Client(base_url=server.url, headers=JSON_HEADERS) as c:
        t = threading.Thread(target=lambda: answers.append(heap(c, {"seconds": 50})))
        t0 = time.monotonic()
        t.start()
        wait_until(lambda: runtime().heap.running and tracemalloc.is_tracing(), what="the heap diff to start")
        mp.shutdown(5)
        t.join(20)
    assert not tracemalloc.is_tracing() and time.monotonic() - t0 < 20
    assert answers and answers[0].status_code == 200, answers
    assert answers[0].json()["stopped_early"] and answers[0].json()["elapsed_seconds"] < 20


# ---- bad input, guards ---------------------------------------------------------------------

@pytest.mark.parametrize("body,field", [
    ({"seconds": 0}, "seconds"), ({"seconds": 56}, "seconds"), ({"seconds": "10"}, "seconds"),
    ({"seconds": True}, "seconds"), ({"seconds": None}, "seconds"), ({"frames": 0}, "frames"),
    ({"frames": 101}, "frames"), ({"frames": 2.5}, "frames"), ({"top": 0}, "top"), ({"top": 201}, "top"),
    ({"top": [3]}, "top"), ({"seconds": 1, "bogus": 1}, "bogus"),
])
def test_out_of_range_or_wrong_type_fields_are_400_naming_the_field(client, body, field):
    detail = error_detail(heap(client, body), 400, "bad_parameter")
    assert field in detail
    assert client.get("/v1/dumps").json() == {"dumps": []} and not runtime().heap.running


@pytest.mark.parametrize("content,error", [(b"[1]", "bad_body"), (b'"x"', "bad_body"), (b"{not json", "bad_json"),
                                           (b'{"seconds": NaN}', "bad_parameter"),
                                           (b'{"seconds": 1e999}', "bad_parameter")])
def test_a_body_that_is_not_an_object_of_fields_is_400(client, content, error):
    error_detail(client.post("/v1/heap", content=content), 400, error)
    error_detail(client.post("/v1/heap", params={"seconds": "5"}, json={}), 400, "bad_parameter")
    assert client.get("/v1/dumps").json() == {"dumps": []}


def test_token_origin_host_and_content_type_guards(tmp_path):
    mp.start_monitoring({"dumps": {"dir": str(tmp_path / "dumps")}})
    srv = mp.serve(port=0, token=TOKEN)
    good = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=srv.url, timeout=30, headers=JSON_HEADERS) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            error_detail(heap(c, headers=headers), 401, "unauthorized")
        error_detail(heap(c, headers={**good, "Origin": "http://evil.example"}), 403, "origin_not_allowed")
        error_detail(heap(c, headers={**good, "Host": "evil.example"}), 403, "host_not_allowed")
        r = c.post("/v1/heap", content=b'{"seconds": 1}', headers={**good, "Content-Type": "text/plain"})
        error_detail(r, 415, "unsupported_media_type")
        assert c.get("/v1/dumps", headers=good).json() == {"dumps": []}
        assert heap(c, headers=good).status_code == 200
    srv.close()
    # without a token, a non-loopback bind refuses it
    srv = mp.serve(host="0.0.0.0", port=0, token="")
    with httpx.Client(base_url=f"http://127.0.0.1:{srv.port}", timeout=30, headers=JSON_HEADERS) as c:
        assert "token" in error_detail(heap(c), 403, "forbidden")
    srv.close()


# ---- the CLI, as a subprocess --------------------------------------------------------------

def cli(*args: str, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    return subprocess.run([sys.executable, "-m", "memprof_otel.cli", "heap", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    (line,) = proc.stderr.strip("\n").split("\n")
    assert line.startswith("memprof-otel: error: ") and fragment in line, line


def test_cli_prints_the_growing_line_first_and_downloads_the_file(tmp_path):
    mp.start_monitoring({"dumps": {"dir": str(tmp_path / "dumps")}})
    srv = mp.serve(port=0, token=TOKEN)
    out = tmp_path / "growth.speedscope.json"
    with Grower():
        text = cli("--url", srv.url, "--seconds", "1", "--top", "3", "--token", TOKEN, "-o", str(out))
        js = cli("--url", srv.url, "--seconds", "1", "--token", TOKEN, "--json")
    assert text.returncode == 0, text.stderr
    rows = [ln for ln in text.stdout.splitlines() if re.match(r"\s*\d+\s+[+-]", ln)]  # "  1  +3.2 MiB  ..."
    assert rows and rows[0].split()[0] == "1" and rows[0].endswith(GROW_SITE), text.stdout
    assert len(rows) <= 3 and "Python heap growth over" in text.stdout
    validate_speedscope(json.loads(out.read_text()))
    assert js.returncode == 0, js.stderr
    assert json.loads(js.stdout)["sites"][0]["site"] == GROW_SITE
    assert not tracemalloc.is_tracing()
    # errors: one line each, exit 2 for bad input, 1 when the endpoint refuses or is not there
    assert_one_line_error(cli("--url", srv.url, "--seconds", "1", "--token", "wrong"), 2, "HTTP 401")
    assert_one_line_error(cli("--url", srv.url, "--seconds", "0", "--token", TOKEN), 2, "--seconds")
    assert_one_line_error(cli("--url", srv.url, "--seconds", "5", "--top", "999", "--token", TOKEN), 2, "--top")
    assert_one_line_error(cli("--url", "ftp://x", "--seconds", "5"), 2, "--url")
    srv.close()
    (port,) = free_ports(1)
    assert_one_line_error(cli("--url", f"http://127.0.0.1:{port}", "--seconds", "1"), 1, "cannot reach")
