"""pprof dumps read by an independent reader, Go's ``go tool pprof``: a real capture of a model whose
allocations we choose, fetched over HTTP and written by ``save(path)``, and a real Python heap diff.
Its totals per sample type must equal the speedscope dump's, its stacks the known sizes."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest
import torch

import memprof_otel as mp
from memprof_otel.dumps.pprof import parse_pprof
from tests.integration.support.binaries import required_binary
from tests.integration.support.helpers import JSON_HEADERS, Traffic, error_detail
from tests.integration.test_dumps_and_oom import KNOWN_STACKS, N_A, N_B0, N_B1, Known, stacks
from tests.integration.test_heap_diff import GROW_SITE, Grower

pytestmark = pytest.mark.timeout(120)

INSTALL_HINT = "install Go with `apt-get install -y golang-go` (it provides `go tool pprof`; CI does; the test never skips)"


def go_binary() -> str:
    return required_binary("go", INSTALL_HINT)


def go_pprof(tmp_path: Path, *args: str) -> str:
    """``go tool pprof ARGS`` with its caches in ``tmp_path`` (it needs a writable HOME/GOCACHE)."""
    env = {**os.environ, "HOME": str(tmp_path), "GOCACHE": str(tmp_path / "gocache"),
           "GOPATH": str(tmp_path / "gopath"), "PPROF_TMPDIR": str(tmp_path)}
    r = subprocess.run([go_binary(), "tool", "pprof", *args], capture_output=True, text=True, env=env, timeout=90)
    assert r.returncode == 0, f"go tool pprof {' '.join(args)} failed:\n{r.stderr}"
    return r.stdout


def raw(tmp_path: Path, path: Path) -> dict:
    """``go tool pprof -raw`` parsed: sample types, samples as (root-first frame names, values), the
    locations' function names and files/lines, the comments."""
    text = go_pprof(tmp_path, "-raw", str(path))
    comments = re.findall(r"^Comment: (.*)$", text, re.M)
    samples_part = text.split("Samples:\n", 1)[1].split("\nLocations\n", 1)[0]
    loc_part = text.split("\nLocations\n", 1)[1].split("\nMappings\n", 1)[0]
    header, *rows = samples_part.splitlines()
    types = [t.replace("[dflt]", "") for t in header.split()]
    locations = {}
    for line in loc_part.splitlines():
        # "<id>: <address> M=<mapping> <name> <file>:<line> s=<start>[(<system name>)]"; pprof shows
        # a name without its <...> parts (C++ templates), so a name in angle brackets shows empty
        m = re.match(r"\s*(\d+): 0x[0-9a-f]+ M=\d+ (.*?) ?(\S*):(\d+)(?::\d+)? s=\d+(?:\((.*)\))?$", line)
        assert m, f"unexpected Locations line: {line!r}"
        locations[int(m[1])] = (m[2] or m[5], m[3], int(m[4]))
    samples = []
    for line in rows:
        m = re.match(r"\s*([-\d ]+): ([\d ]+)$", line)
        if m:
            values = tuple(int(v) for v in m[1].split())
            ids = [int(i) for i in m[2].split()]
            samples.append((tuple(locations[i][0] for i in reversed(ids)), values))
    return {"types": types, "samples": samples, "locations": locations, "comments": comments, "text": text}


def totals(parsed: dict) -> list[int]:
    return [sum(v[i] for _, v in parsed["samples"]) for i in range(len(parsed["types"]))]


def test_http_pprof_of_a_capture_reads_back_in_go_pprof(tmp_path):
    mp.start_monitoring({"sampler": {"interval": "50ms"}, "dumps": {"dir": str(tmp_path / "dumps")}})
    srv = mp.serve(port=0)
    c = httpx.Client(base_url=srv.url, timeout=60, headers=JSON_HEADERS)
    model = Known()
    mp.instrument(model, name="known")
    with Traffic(model):
        r = c.post("/v1/dumps", params={"forwards": 3, "timeout": 10, "wait": 30})
    assert r.status_code == 200, r.text
    url = r.json()["dump"]["url"]
    doc = c.get(url).json()
    resp = c.get(url, params={"format": "pprof"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/octet-stream"
    assert resp.headers["content-disposition"].endswith('.pb.gz"')
    assert resp.content[:2] == b"\x1f\x8b"  # gzipped, as pprof files are
    path = tmp_path / "known.pb.gz"
    path.write_bytes(resp.content)

    parsed = raw(tmp_path, path)
    assert parsed["types"] == ["alloc_space/bytes", "alloc_objects/count"]
    weights = doc["profiles"][0]["weights"]
    assert totals(parsed) == [sum(weights), 3 * len(KNOWN_STACKS)]  # one allocation per layer per forward
    assert sum(weights) == 3 * (N_A + N_B0 + N_B1)
    assert {s: v[0] for s, v in parsed["samples"]} == {k: 3 * n for k, n in KNOWN_STACKS.items()} == stacks(doc)
    assert {s: v[1] for s, v in parsed["samples"]} == {k: 3 for k in KNOWN_STACKS}
    names = {n for n, _, _ in parsed["locations"].values()}
    assert names == {"known", "a", "b", "b.0", "b.1", "aten::empty.memory_format"}
    assert "model=known" in parsed["comments"] and "device=cpu" in parsed["comments"]
    assert re.search(r"model:\[known\]", parsed["text"]) and re.search(r"device:\[cpu\]", parsed["text"])

    top = go_pprof(tmp_path, "-top", "-sample_index=alloc_space", str(path))
    m = re.search(r"of ([\d.]+)([kMG]?B) total", top)
    assert m, top
    scale = {"B": 1, "kB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3}[m[2]]
    assert abs(float(m[1]) * scale - sum(weights)) <= 0.01 * sum(weights)

    # an unknown format is the project's JSON 400
    assert "speedscope, pprof" in error_detail(c.get(url, params={"format": "folded"}), 400, "bad_parameter")
    assert c.get(url, params={"format": "speedscope"}).json() == doc


def test_save_by_extension_writes_pprof_that_go_reads(tmp_path):
    model = Known()
    h = mp.instrument(model, name="known", overhead_budget=0.0)  # only the capture attributes
    cap = h.capture(forwards=2)
    x = torch.randn(4, 8)
    for _ in range(2):
        with mp.operation("embed"):  # the request both captured forwards serve
            model(x)
    assert cap.wait(5)
    pb, pp, js = tmp_path / "k.pb.gz", tmp_path / "k.pprof", tmp_path / "k.json"
    cap.save(pb)
    h.export_speedscope(str(pp))
    cap.save(js)
    assert pb.read_bytes()[:2] == pp.read_bytes()[:2] == b"\x1f\x8b"
    assert gzip.decompress(pb.read_bytes()) == gzip.decompress(pp.read_bytes())
    doc = json.loads(js.read_text())
    parsed = raw(tmp_path, pb)
    assert totals(parsed) == [sum(doc["profiles"][0]["weights"]), 2 * len(KNOWN_STACKS)]
    assert {s: v[0] for s, v in parsed["samples"]} == {k: 2 * n for k, n in KNOWN_STACKS.items()}
    # labelled with the operation the forwards ran in, as go's reader shows sample labels
    assert "operation:[embed]" in parsed["text"] and "model:[known]" in parsed["text"]
    prof = parse_pprof(pb.read_bytes())
    assert prof.time_nanos == int(cap.created_unix * 1e9)
    assert prof.duration_nanos > 0


def test_heap_diff_pprof_names_the_growing_line(tmp_path):
    mp.start_monitoring({"sampler": {"interval": "50ms"}, "dumps": {"dir": str(tmp_path / "dumps")}})
    srv = mp.serve(port=0)
    c = httpx.Client(base_url=srv.url, timeout=90, headers=JSON_HEADERS)
    with Grower():
        r = c.post("/v1/heap", json={"seconds": 1, "frames": 4})
    assert r.status_code == 200, r.text
    dump = r.json()["dump"]
    doc = c.get(dump["url"]).json()
    resp = c.get(dump["url"], params={"format": "pprof"})
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/octet-stream"
    path = tmp_path / "heap.pb.gz"
    path.write_bytes(resp.content)
    parsed = raw(tmp_path, path)
    assert parsed["types"] == ["inuse_space/bytes", "inuse_objects/count"]
    assert totals(parsed)[0] == sum(doc["profiles"][0]["weights"]) == doc["profiles"][0]["endValue"]
    file, line = GROW_SITE.rsplit(":", 1)
    grow = [loc for loc in parsed["locations"].values() if loc[0] == GROW_SITE]
    assert grow == [(GROW_SITE, file, int(line))]  # the function's file and the location's line are set
    at_site = [v for s, v in parsed["samples"] if s[-1] == GROW_SITE]
    assert at_site and sum(v[0] for v in at_site) >= 100 * 4096 and sum(v[1] for v in at_site) >= 100
