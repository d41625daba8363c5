"""memprof-otel in pre-fork servers, for real: forked children speak as themselves over OTLP, and a
real gunicorn / uvicorn with two workers is scraped by a real Prometheus on one port.

References are independent of our code: the OTLP receiver decodes with opentelemetry-proto; worker
pids and their resident memory come from the process table (psutil); Prometheus stores what it
scraped and answers PromQL."""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

import memprof_otel as mp
from memprof_otel.export.exposition_merge import SERVICE_WIDE
from memprof_otel.http.app import Request
from memprof_otel.metric_names import BY_PROM
from memprof_otel.runtime import runtime
from tests.integration.support.demo_process import REPO, free_port_block, free_ports
from tests.integration.support.otlp_receiver import OtlpReceiver, metrics_of, spans_of
from tests.integration.support.prom_server import PromHandle, running_prometheus

RSS = "memprof_process_resident_memory_bytes"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


# ---------------------------------------------------------------- forked children over OTLP

def _child(i: int, q: Any) -> None:
    with mp.operation("child-op", worker=i):
        time.sleep(0.05)
    time.sleep(0.6)  # a few of the child's own periodic exports
    q.put(os.getpid())
    mp.shutdown(3)  # multiprocessing ends a child with os._exit: no atexit flush


@pytest.mark.timeout(60)
def test_forked_children_export_their_own_data_under_their_own_instance_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    # the SDK's process detector puts process.pid in the resource, and updates it in a forked
    # child: it tells which process sent an export, whatever service.instance.id it carries
    monkeypatch.setenv("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS", "process")
    receiver = OtlpReceiver()
    try:
        # GIVEN monitoring with OTLP export started in the parent, which ends one operation
        mp.start_monitoring({"otel": {"endpoint": receiver.url, "export_interval": "0.2s"},
                             "sampler": {"interval": "0.1s"}})
        with mp.operation("parent-op"):
            pass
        delta = BY_PROM["memprof_operation_memory_delta_bytes"].otel
        _until(lambda: any(m.name == delta for _, m in metrics_of(receiver.got("/v1/metrics"))), 10,
               "the parent's first export with its operation")
        before_fork = len(receiver.got("/v1/metrics"))
        # WHEN two children are forked (the parent's span may still sit in its export queue) and
        # each runs an operation of its own
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        children = [ctx.Process(target=_child, args=(i, q)) for i in range(2)]
        for c in children:
            c.start()
        for c in children:
            c.join(30)
        assert [c.exitcode for c in children] == [0, 0]
        pids = {q.get(timeout=5) for _ in children}
        mp.shutdown(3)
    finally:
        receiver.close()

    spans = spans_of(receiver.got("/v1/traces"))
    by_name: dict[str, list[str]] = {}
    for res, span in spans:
        by_name.setdefault(span.name, []).append(str(res["service.instance.id"]))
    # THEN each child's span went out under an instance id of its own, not the parent's
    parent_ids = by_name.get("parent-op", [])
    child_ids = by_name.get("child-op", [])
    assert len(child_ids) == 2 and len(set(child_ids)) == 2, by_name
    assert not set(child_ids) & set(parent_ids)
    # AND the parent's span went out once, by the parent: no child exported it again
    assert len(parent_ids) == 1, by_name
    # AND each child pushed its own metrics under its id; the pid resource attribute is its own
    metric_res: dict[str, set[str]] = {}
    for res, m in metrics_of(receiver.got("/v1/metrics")):
        metric_res.setdefault(str(res["service.instance.id"]), set()).add(m.name)
    for cid in child_ids:
        assert BY_PROM[RSS].otel in metric_res.get(cid, set()), f"child {cid} exported no metrics: {sorted(metric_res)}"
    # AND nothing went out under the parent's id from a child: every export under it has the
    # parent's operation (a child starts with no operations; the parent's inherited exporters, in a
    # child, would send the child's figures as the parent's)
    senders = {(str(res["service.instance.id"]), res["process.pid"])
               for res, _ in metrics_of(receiver.got("/v1/metrics")[before_fork:])}
    assert {pid for iid, pid in senders if iid in parent_ids} == {os.getpid()}, senders
    # AND each process exported under one identity only (the parent's inherited providers, left to
    # the SDK's own fork handling, would go on exporting the child's figures as a second instance)
    ids_by_pid: dict[Any, set[str]] = {}
    for iid, pid in senders:
        ids_by_pid.setdefault(pid, set()).add(iid)
    assert all(len(ids) == 1 for ids in ids_by_pid.values()), ids_by_pid
    assert len(ids_by_pid) == 3, ids_by_pid  # the parent and two children
    # AND a child's operation histogram holds only the child's operation, never the parent's
    for res, m in metrics_of(receiver.got("/v1/metrics")):
        if str(res["service.instance.id"]) in child_ids and m.HasField("histogram") and "operation" in m.name:
            ops = {a.value.string_value for p in m.histogram.data_points for a in p.attributes
                   if a.key == "operation"}
            assert "parent-op" not in ops, (m.name, ops)
    assert len(pids) == 2


@pytest.mark.timeout(60)
def test_an_instance_id_the_user_fixed_is_kept_by_forked_children(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a fixed service.instance.id through the standard variable (a pod name, say)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=pod-7")
    receiver = OtlpReceiver()
    try:
        mp.start_monitoring({"otel": {"endpoint": receiver.url, "export_interval": "0.2s"},
                             "sampler": {"interval": "0.1s"}})
        # WHEN two children are forked and each runs an operation
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        children = [ctx.Process(target=_child, args=(i, q)) for i in range(2)]
        for c in children:
            c.start()
        for c in children:
            c.join(30)
        assert [c.exitcode for c in children] == [0, 0]
        mp.shutdown(3)
    finally:
        receiver.close()
    # THEN both children's spans carry the id the user set: the renewal does not override it
    ids = [str(res["service.instance.id"]) for res, span in spans_of(receiver.got("/v1/traces"))
           if span.name == "child-op"]
    assert ids == ["pod-7", "pod-7"], ids


def _child_writes_its_file(folder: str, q: Any) -> None:
    path = Path(folder) / f"{os.getpid()}.om"
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    q.put(path.exists())
    mp.shutdown(3)
    q.put(path.exists())


@pytest.mark.timeout(60)
def test_a_child_forked_while_a_parent_thread_holds_the_runtimes_locks_keeps_monitoring(tmp_path: Path) -> None:
    # GIVEN single-port mode, and a parent thread inside the operation statistics and the tracker
    # (their locks held) at the moment of the fork
    folder = str(tmp_path / "snapshots")
    mp.start_monitoring({"workers": {"snapshot_dir": folder, "snapshot_interval": "0.1s"},
                         "sampler": {"interval": "0.05s"}})
    rt = runtime()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with rt.op_stats._lock, rt.tracker._lock:  # a scrape or a tick, caught mid-way
            held.set()
            release.wait(10)
    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    try:
        # WHEN a child is forked then
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        child = ctx.Process(target=_child_writes_its_file, args=(folder, q))
        child.start()
    finally:
        release.set()
        t.join()
    child.join(30)
    # THEN the child's sampler runs through the scrape path (its own file appears) and its
    # shutdown removes the file
    assert child.exitcode == 0
    assert q.get(timeout=5) is True, "the child never wrote its series: its sampler is stuck"
    assert q.get(timeout=5) is False


# ---------------------------------------------------------------- the merge on a real exposition

def _om_samples(text: str, worker: str | None = None) -> set[tuple[Any, ...]]:
    out = set()
    for fam in om_parse(text):
        for s in fam.samples:
            labels = {**s.labels, "worker": worker} if worker is not None else s.labels
            out.add((fam.name, fam.type, fam.unit, s.name, frozenset(labels.items()), s.value))
    return out


def _single_port_mlp(tmp_path: Path) -> tuple[torch.nn.Module, Path]:
    """Monitoring in single-port mode (this process's file in the returned folder) and a small
    model instrumented with every forward attributed."""
    folder = tmp_path / "snapshots"
    mp.start_monitoring({"workers": {"snapshot_dir": str(folder), "snapshot_interval": "0.1s"},
                         "sampler": {"interval": "0.05s"}})
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    mp.instrument(model, name="mlp", every_n_forwards=1, overhead_budget=1.0)
    return model, folder


def test_single_port_scrape_of_a_real_runtime_is_each_workers_exposition_labelled(tmp_path: Path) -> None:
    # GIVEN a monitored process with an instrumented model and an operation, in single-port mode,
    # and another worker's file (here: a copy of this process's exposition under another pid)
    model, folder = _single_port_mlp(tmp_path)
    with mp.operation("infer"):
        model(torch.randn(4, 16))
    own = folder / f"{os.getpid()}.om"
    _until(lambda: own.exists() and b'operation="infer"' in own.read_bytes() and b'layer="2"' in own.read_bytes(),
           10, "this process's file with the model's layers and the operation")
    sibling = psutil.Process(os.getppid())  # a live process that writes no file of its own
    copied = own.read_bytes()
    (folder / f"{sibling.pid}.om").write_bytes(copied)

    # WHEN /metrics is read in OpenMetrics (as Prometheus asks) and in the text format
    ep = mp.wsgi_app().endpoint  # type: ignore[attr-defined]
    om = ep.handle(Request("GET", "/metrics", headers={"accept": OPENMETRICS})).body.decode()
    text = ep.handle(Request("GET", "/metrics", headers={})).body.decode()

    # THEN it is the sibling's exposition and this process's, each sample labelled with its pid,
    # but for the service's own figures (the post-mortem count), served once without a worker
    got = _om_samples(om)
    shared = {x for x in got if x[0] in SERVICE_WIDE}
    assert {x[0] for x in shared} == {"memprof_postmortems"}
    assert all("worker" not in dict(x[4]) for x in shared)
    assert {dict(x[4])["reason"] for x in shared if x[3].endswith("_total")} == {"oom_kill", "killed", "exited"}
    sibling_part = {x for x in got if ("worker", str(sibling.pid)) in x[4]}
    assert sibling_part == {x for x in _om_samples(copied.decode(), str(sibling.pid)) if x[0] not in SERVICE_WIDE}
    mine = {x for x in got if ("worker", str(os.getpid())) in x[4]}
    assert {x[0] for x in mine} == {x[0] for x in sibling_part}  # the same families
    assert len(got) == len(mine) + len(sibling_part) + len(shared)  # every other sample has one of the two workers
    layer = {x for x in mine if x[0] == "memprof_layer_peak_increase_bytes"}
    assert {dict(x[4])["layer"] for x in layer} >= {"0", "2"}, layer
    # AND the text format says the same in its own syntax
    samples = {(s.name, frozenset(s.labels.items())) for f in text_parse(text) for s in f.samples}
    assert {(x[3], x[4]) for x in sibling_part} <= samples


# ---------------------------------------------------------------- real pre-fork servers

# how long a server has to stop after SIGTERM: gunicorn waits --graceful-timeout (3 s here) for its workers
STOP_S = 10.0


@contextmanager
def running_server(cmd: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)
    hung = False
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # a deploy's stop: every process of the server
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                hung = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
    # a server that outlives its SIGTERM would be SIGKILLed by the orchestrator: a failure of the
    # test (a preloading master's endpoint thread once held its exit until the next connection)
    assert not hung, f"the server did not stop within {STOP_S} s of SIGTERM\n{log.read_text()}"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMPROF_OTEL_", "OTEL_"))}
    env.update({"PYTHONPATH": str(REPO), "MEMPROF_OTEL_SAMPLER_INTERVAL": "0.25s", "WEB_CONCURRENCY": "1"})
    env.update(extra)
    return env


def _workers(proc: subprocess.Popen[bytes], n: int, log: Path, timeout: float = 60.0) -> set[int]:
    """The server's ``n`` worker pids (children running Python; not uvicorn's resource tracker)."""
    deadline = time.monotonic() + timeout
    while True:
        kids = set()
        for c in psutil.Process(proc.pid).children():
            try:
                cmd = c.cmdline()
            except psutil.Error:
                continue
            if "resource_tracker" not in " ".join(cmd):
                kids.add(c.pid)
        if len(kids) == n:
            return kids
        assert proc.poll() is None and time.monotonic() < deadline, f"workers: {kids}\n{log.read_text()}"
        time.sleep(0.2)


def _worker_labels(prom: PromHandle, metric: str = RSS) -> dict[int, float]:
    return {int(r["metric"]["worker"]): float(r["value"][1]) for r in prom.query(metric)}


def _until(cond: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.25)
    return time.monotonic() - t0


def _hit(url: str, n: int) -> None:
    for _ in range(n):  # a new connection each time, so the workers share them
        with urllib.request.urlopen(url, timeout=60) as r:  # noqa: S310 - workers may still be importing torch
            r.read()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("preload", [True, False], ids=["preload", "no-preload"])
def test_gunicorn_two_workers_one_port_prometheus_sees_both_and_drops_a_killed_one(
        tmp_path: Path, preload: bool) -> None:
    # GIVEN gunicorn with 2 workers, single-port mode on (a shared snapshot folder) and memprof's
    # endpoint served from the app module: with --preload in the master before the fork (each
    # worker serves the inherited socket), else in each worker (each binds the port, SO_REUSEPORT)
    port, app_port = free_ports(2)
    env = _env(tmp_path, PREFORK_SERVE="1", MEMPROF_OTEL_HTTP_PORT=str(port),
               MEMPROF_OTEL_WORKERS_SNAPSHOT_DIR=str(tmp_path / "snapshots"),
               MEMPROF_OTEL_WORKERS_SNAPSHOT_INTERVAL="0.5s")
    cmd = [sys.executable, "-m", "gunicorn", *(["--preload"] if preload else []), "-w", "2",
           "-b", f"127.0.0.1:{app_port}", "--graceful-timeout", "3", "tests.integration.support.prefork_app:app"]
    log = tmp_path / "gunicorn.log"
    with running_server(cmd, env, log) as server, \
            running_prometheus([f"127.0.0.1:{port}"], tmp_path) as prom:
        workers = _workers(server, 2, log)
        expected = workers | ({server.pid} if preload else set())  # a preloading master monitors too
        _hit(f"http://127.0.0.1:{app_port}/", 6)

        # WHEN Prometheus scrapes the one port
        prom.query_until(f"count({RSS}) >= {len(expected)}", timeout=90, what="every process's series")
        seen = _worker_labels(prom)

        # THEN it has every worker's series, each labelled with its pid, through one target
        assert set(seen) == expected, f"{seen}\n{log.read_text()}"
        assert len({r["metric"]["instance"] for r in prom.query(RSS)}) == 1
        # AND each worker's figure is that worker's own: its resident memory as the kernel reports it
        for pid in workers:
            rss = psutil.Process(pid).memory_info().rss
            assert abs(seen[pid] - rss) / rss < 0.25, (pid, seen[pid], rss)
        layers = prom.query('memprof_layer_forward_seconds_count{model="tiny"}')
        assert {int(r["metric"]["worker"]) for r in layers} & workers, layers

        # WHEN one worker is killed (no chance to remove its file); gunicorn starts a replacement
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()

        # THEN its series leave Prometheus within a bounded time, and the replacement's arrive
        gone = _until(lambda: not prom.query(f'{RSS}{{worker="{victim}"}}'), 15.0, "the killed worker's series gone")
        replacement = _workers(server, 2, log) - workers
        assert len(replacement) == 1
        prom.query_until(f'{RSS}{{worker="{replacement.pop()}"}}', timeout=90, what="the replacement's series")
        assert gone < 15.0 and time.monotonic() - t0 < 120
        assert "Traceback" not in log.read_text()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_uvicorn_workers_with_the_mounted_endpoint(tmp_path: Path) -> None:
    # GIVEN uvicorn --workers 2 serving memprof's ASGI app, without the single-port mode
    app_port = free_ports(1)[0]
    cmd = [sys.executable, "-m", "uvicorn", "tests.integration.support.prefork_app:asgi", "--workers", "2",
           "--host", "127.0.0.1", "--port", str(app_port), "--log-level", "warning"]
    log = tmp_path / "uvicorn-plain.log"
    with running_server(cmd, _env(tmp_path), log) as server:
        _workers(server, 2, log)
        # WHEN it is scraped
        _until(lambda: _get_ok(f"http://127.0.0.1:{app_port}/metrics"), 90, "the workers answering")
        _hit(f"http://127.0.0.1:{app_port}/metrics", 4)
        # THEN the worker that answered warns, once, that scrapes round-robin between workers
        _until(lambda: "mounted in a server with 2 worker processes" in log.read_text(), 10, "the warning")
    assert log.read_text().count("mounted in a server with") <= 2  # at most once per worker

    # GIVEN the same with workers.snapshot_dir set
    log = tmp_path / "uvicorn-single-port.log"
    env = _env(tmp_path, MEMPROF_OTEL_WORKERS_SNAPSHOT_DIR=str(tmp_path / "snapshots"),
               MEMPROF_OTEL_WORKERS_SNAPSHOT_INTERVAL="0.5s")
    with running_server(cmd, env, log) as server, \
            running_prometheus([f"127.0.0.1:{app_port}"], tmp_path) as prom:
        workers = _workers(server, 2, log)
        # WHEN Prometheus scrapes the app's port
        prom.query_until(f"count({RSS}) >= 2", timeout=90, what="both workers' series")
        # THEN it sees both workers, whichever answers, and no warning was given
        assert set(_worker_labels(prom)) == workers
    assert "mounted in a server with" not in log.read_text()


def _get_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - a local test server
            return r.status == 200
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_gunicorn_preload_with_a_port_range_gives_each_worker_its_own_port(tmp_path: Path) -> None:
    # GIVEN gunicorn --preload, 2 workers, memprof served from the master with http.port_count 3
    base = free_port_block(3)
    app_port = free_ports(1)[0]
    env = _env(tmp_path, PREFORK_SERVE="1", MEMPROF_OTEL_HTTP_PORT=str(base), MEMPROF_OTEL_HTTP_PORT_COUNT="3")
    cmd = [sys.executable, "-m", "gunicorn", "--preload", "-w", "2", "-b", f"127.0.0.1:{app_port}",
           "--graceful-timeout", "3", "tests.integration.support.prefork_app:app"]
    log = tmp_path / "gunicorn.log"
    with running_server(cmd, env, log) as server:
        workers = _workers(server, 2, log)
        procs = {pid: psutil.Process(pid) for pid in {server.pid} | workers}

        def listening() -> dict[int, set[int]]:
            return {pid: {c.laddr.port for c in p.net_connections("tcp")
                          if c.status == psutil.CONN_LISTEN and base <= c.laddr.port < base + 3}
                    for pid, p in procs.items()}
        _until(lambda: all(len(v) == 1 for v in listening().values()), 60, "one port each")
        ports = listening()
        # THEN the master and each worker listen on a port of the range of their own
        assert sorted(p for v in ports.values() for p in v) == [base, base + 1, base + 2], ports
        assert ports[server.pid] == {base}
        # AND each port answers with the figures of the process that listens on it
        for pid, (p,) in ports.items():
            with urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=10) as r:  # noqa: S310
                text = r.read().decode()
            value = next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(RSS + " "))
            rss = psutil.Process(pid).memory_info().rss
            assert abs(value - rss) / rss < 0.25, (pid, p, value, rss)
    # AND no worker mistook its own port for a shared one
    assert "mounted in a server with" not in log.read_text()


def test_single_port_series_exported_counts_the_whole_answer_and_no_snapshot(tmp_path: Path) -> None:
    # GIVEN single-port mode with this process's file and another worker's (a copy under a live pid)
    model, folder = _single_port_mlp(tmp_path)
    model(torch.randn(4, 16))
    own = folder / f"{os.getpid()}.om"
    _until(lambda: own.exists() and b'layer="2"' in own.read_bytes(), 10, "this process's file with the layers")
    # several snapshot renders: none of them is an answer, so the count stays what an earlier
    # answer in this process left (none in a fresh one)
    before = runtime().budget.series_exported
    time.sleep(0.3)
    counted = [ln for ln in own.read_bytes().splitlines() if ln.startswith(b"memprof_series_exported")]
    assert counted == ([] if before is None else [b"memprof_series_exported %.1f" % before])
    sibling = psutil.Process(os.getppid())
    (folder / f"{sibling.pid}.om").write_bytes(own.read_bytes())
    ep = mp.wsgi_app().endpoint  # type: ignore[attr-defined]

    # WHEN /metrics is answered twice
    first = ep.handle(Request("GET", "/metrics", headers={"accept": OPENMETRICS})).body.decode()
    second = ep.handle(Request("GET", "/metrics", headers={"accept": OPENMETRICS})).body.decode()

    # THEN the second carries, under this worker, the samples of the whole first answer (both
    # workers' series: what the scraper got), counted here by prometheus_client's parser
    in_first = len(_om_samples(first))
    assert {x[3] for x in _om_samples(first) if ("worker", str(sibling.pid)) in x[4]}  # the sibling is in it
    exported = [x[5] for x in _om_samples(second)
                if x[3] == "memprof_series_exported" and ("worker", str(os.getpid())) in x[4]]
    assert exported == [in_first]
