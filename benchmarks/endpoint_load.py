"""Forward latency of an instrumented model while its endpoint is read hard, and while the OTLP
collector is down or hung — each against a control without that load, in one process.

    python -m benchmarks.endpoint_load            # ~2 min on 2 cores
    python -m benchmarks.endpoint_load --quick    # fewer pairs, for a smoke run

The model (a stack of ``Linear(256, 256)`` + ReLU, instrumented with the shipped config) runs its
forwards back to back on the main thread. The runtime holds an hour of history: the sampler's buffer
is filled with 3,600 samples and the operation log with 10,000 records before timing, so
``GET /v1/timeline`` has the most it can ever have to page through. OTLP export runs throughout
(metrics every second) to a local fake collector.

Load sides run in other processes, as they do in production:

- ``reads``: a client process loops over ``GET /v1/timeline`` (default page), ``GET
  /v1/timeline?limit=5000`` (the largest page), ``/metrics`` and ``/v1/status`` on 127.0.0.1, one
  request after the other, as fast as the server answers.
- ``collector-down`` / ``collector-hung``: the fake collector has closed its port, or accepts and
  never answers; the control is the same collector healthy (answering 200).

Blocks of forwards alternate between the control and the loaded side (order flipped every pair) so
drift cancels; latencies are pooled per side. ``aa-control`` runs the control on both sides: the
noise floor of the machine. Reported: median and p99 forward time per side, and p99(load) /
p99(control).
"""
from __future__ import annotations

import argparse
import http.client
import json
import logging
import multiprocessing as mproc
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

import memprof_otel as mp

UP, DOWN, HUNG = 0, 1, 2
READ_PATHS = ("/v1/timeline", "/v1/timeline?limit=5000", "/metrics", "/v1/status")


# ---- load processes ----------------------------------------------------------------------------

def _reader(port: int, active: Any, requests: Any, received: Any, stop: Any) -> None:
    """Reads the endpoint as fast as it answers while ``active`` is set (127.0.0.1 only)."""
    i = 0
    while not stop.is_set():
        if not active.is_set():
            time.sleep(0.002)
            continue
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", READ_PATHS[i % len(READ_PATHS)])
            body = conn.getresponse().read()
            with requests.get_lock():
                requests.value += 1
                received.value += len(body)
        except OSError:
            time.sleep(0.01)
        finally:
            conn.close()
        i += 1


def _answer_otlp(conn: socket.socket) -> None:
    """Read one OTLP/HTTP request and answer 200 with an empty protobuf message."""
    conn.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n"
                 b"Connection: close\r\n\r\n")


def _collector(port: int, mode: Any, exports: Any, stop: Any) -> None:
    """A fake OTLP/HTTP collector on 127.0.0.1:``port``: healthy, closed (no listening socket) or
    hung (accepts, reads nothing, never answers), as ``mode`` says."""
    listener: socket.socket | None = None
    hung: list[socket.socket] = []
    while not stop.is_set():
        want = mode.value
        if want == DOWN and listener is not None:
            listener.close()
            listener = None
        if want != DOWN and listener is None:
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(64)
            listener.settimeout(0.02)
        if want != HUNG and hung:
            for c in hung:
                c.close()
            hung.clear()
        if listener is None:
            time.sleep(0.02)
            continue
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        with exports.get_lock():
            exports.value += 1
        if want == HUNG:
            hung.append(conn)
            continue
        try:
            _answer_otlp(conn)
        except OSError:
            pass
        finally:
            conn.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- the model and its history -------------------------------------------------------------------

def make_model(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods).eval()


def fill_history(samples: int, operations: int) -> None:
    """An hour of samples and a full operation log, without waiting an hour: copies of one real
    sample at 1 s steps into the sampler's buffer, and real (empty) operations."""
    from memprof_otel.runtime import runtime

    rt = runtime()
    sampler = rt.sampler
    assert sampler is not None
    deadline = time.monotonic() + 10
    while sampler.latest() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    base = sampler.latest()
    assert base is not None, "the sampler took no sample"
    now = time.time()
    for i in range(samples):
        sampler._buffer.append(type(base)(now - samples + i, base.process, base.allocators, base.gpus, None))
    for i in range(operations):
        with mp.operation("history", i=i):
            pass


# ---- timing --------------------------------------------------------------------------------------

@dataclass
class Row:
    condition: str
    pairs: int
    forwards_per_block: int
    control_median_ms: float
    control_p99_ms: float
    load_median_ms: float
    load_p99_ms: float
    p99_ratio: float
    load_max_ms: float
    control_max_ms: float
    load_activity: str

    def line(self) -> str:
        return (f"{self.condition:<15} control median {self.control_median_ms:6.3f} ms p99 {self.control_p99_ms:7.3f} "
                f"| load median {self.load_median_ms:6.3f} ms p99 {self.load_p99_ms:7.3f} "
                f"| p99 x{self.p99_ratio:5.2f} | max {self.control_max_ms:6.1f} / {self.load_max_ms:6.1f} ms "
                f"| {self.load_activity}")


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98]


def time_block(forward: Callable[[], None], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        forward()
        out.append(time.perf_counter() - t0)
    return out


def paired_condition(name: str, forward: Callable[[], None], on: Callable[[], None], off: Callable[[], None],
                     pairs: int, block: int, settle: float, activity: Callable[[], str]) -> Row:
    """Blocks with the load ``on`` and ``off`` alternate (order flipped every pair)."""
    control: list[float] = []
    load: list[float] = []
    for i in range(pairs):
        for loaded in ((False, True) if i % 2 == 0 else (True, False)):
            (on if loaded else off)()
            time.sleep(settle)  # the load reaches its steady state before timing
            (load if loaded else control).extend(time_block(forward, block))
        off()
    ms = lambda xs, f: f(xs) * 1e3  # noqa: E731
    return Row(name, pairs, block, ms(control, statistics.median), ms(control, p99), ms(load, statistics.median),
               ms(load, p99), p99(load) / p99(control), ms(load, max), ms(control, max), activity())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer pairs (smoke run)")
    ap.add_argument("--pairs", type=int, default=None)
    ap.add_argument("--block", type=int, default=1500, help="forwards per block")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--conditions", default="aa-control,reads,collector-down,collector-hung")
    ap.add_argument("--json", default=None, help="write the rows here too")
    args = ap.parse_args()
    pairs = args.pairs or (3 if args.quick else 8)

    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)  # retries against a dead collector
    ctx = mproc.get_context("spawn")
    stop = ctx.Event()
    reading = ctx.Event()
    requests, received, exports = ctx.Value("l", 0), ctx.Value("q", 0), ctx.Value("l", 0)
    mode = ctx.Value("i", UP)
    otlp_port = _free_port()
    collector = ctx.Process(target=_collector, args=(otlp_port, mode, exports, stop), daemon=True)
    collector.start()

    dumps_dir = tempfile.mkdtemp(prefix="memprof-bench-dumps-")
    mp.start_monitoring({"sampler": {"interval": "1s"}, "dumps": {"dir": dumps_dir},
                         "otel": {"endpoint": f"http://127.0.0.1:{otlp_port}", "protocol": "http/protobuf",
                                  "export_interval": "1s", "export_timeout": "5s"}})
    srv = mp.serve(port=0)
    reader = ctx.Process(target=_reader, args=(srv.port, reading, requests, received, stop), daemon=True)
    reader.start()

    model = make_model(args.layers)
    mp.instrument(model, name="bench")
    x = torch.randn(8, 256)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    fill_history(3600, 10_000)
    time.sleep(3)  # the history's spans leave the export queue before timing
    for _ in range(300):
        forward()
    page = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    page.request("GET", "/v1/timeline?limit=5000")
    biggest = len(page.getresponse().read())
    page.close()

    print(f"# endpoint_load: torch {torch.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, {args.layers} x Linear(256, 256), "
          f"{pairs} pairs x {args.block} forwards; largest timeline page {biggest / 2**20:.2f} MiB", flush=True)

    def counted(value: Any) -> Callable[[], int]:
        start = [value.value]

        def delta() -> int:
            d = value.value - start[0]
            start[0] = value.value
            return d
        return delta

    nothing = lambda: None  # noqa: E731
    rows = []
    for cond in args.conditions.split(","):
        if cond == "aa-control":
            row = paired_condition(cond, forward, nothing, nothing, pairs, args.block, 0.05, lambda: "none")
        elif cond == "reads":
            reqs, got = counted(requests), counted(received)
            row = paired_condition(cond, forward, reading.set, reading.clear, pairs, args.block, 0.2,
                                   lambda: f"{reqs()} reads, {got() / 2**20:.0f} MiB")
        elif cond in ("collector-down", "collector-hung"):
            want = DOWN if cond == "collector-down" else HUNG
            tries = counted(exports)

            def on(want: int = want) -> None:
                mode.value = want

            def off() -> None:
                mode.value = UP
            row = paired_condition(cond, forward, on, off, pairs, args.block, 0.5,
                                   lambda: f"{tries()} connections accepted by the collector")
        else:
            raise SystemExit(f"unknown condition {cond!r}")
        rows.append(row)
        print(row.line(), flush=True)

    stop.set()
    reader.join(5)
    collector.join(5)
    srv.close()
    mp.shutdown(2)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"python": sys.version, "torch": torch.__version__, "rows": [asdict(r) for r in rows]}, f,
                      indent=1)


if __name__ == "__main__":
    main()
