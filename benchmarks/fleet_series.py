"""How many series a fleet of instrumented pods sends to a real Prometheus, per exporter configuration.

    python -m benchmarks.fleet_series --targets 50 --duration 40          # smoke run (~1.5 min)
    python -m benchmarks.fleet_series --targets 1000 --config full        # every layer exported (default)
    python -m benchmarks.fleet_series --targets 1000 --config top         # fleet mode: series.layers = "top"
    python -m benchmarks.fleet_series ... --scrape-interval 30 --json out.json

One process stands in for N pods. It builds a 12-layer GPT-2 from a config with ``transformers``
(``GPT2Config(n_layer=12, n_embd=256, n_head=4, vocab_size=1000)``, no download), instruments it
with ``every_n_forwards=1, overhead_budget=1.0`` and the config section ``{"series": {"layers":
"all"}}`` for ``--config full`` (no config where the library has no ``series`` section: every layer
was exported then) or ``{"series": {"layers": "top"}}`` for ``--config top`` (the root and the
``top_layers`` layers with the highest peak increase), runs a few forwards so every layer has
figures, starts monitoring and the library's own endpoint on 127.0.0.1. A small asyncio server
then answers
``GET /metrics`` on N loopback addresses (127.0.0.2, 127.0.0.3, ...: Linux routes all of 127/8 to
``lo``) on one port, so each address is a distinct Prometheus target (its ``instance`` differs).
Every answer is the body the library rendered for that scrape's ``Accept`` header, fetched from the
library's endpoint and cached for ~1 s (so 1,000 scrapes do not each re-render it).

A real ``prometheus`` (the binary on PATH or /usr/bin/prometheus), its TSDB in a temp dir, scrapes
the N targets every ``--scrape-interval`` seconds (timeout: the interval, at most 10 s) and itself.
After ``--duration`` seconds (extended to at least 3 scrape rounds) the figures come from its API:

- **series/target**: sample lines in one body as served to Prometheus at the end of the run (and
  Prometheus's own ``scrape_samples_scraped``, averaged over the targets' last scrapes, which should
  agree); **layer series/target**: ``memprof_layer_*`` lines;
- **head series**: ``prometheus_tsdb_head_series`` (all series in memory: the fleet's, the 5
  ``up``/``scrape_*`` series per target, and Prometheus's own);
- **memprof series** / **per-layer series**: ``count({__name__=~"memprof_.*"})`` and
  ``count({__name__=~"memprof_layer_.*"})``;
- **RSS**: Prometheus's resident memory (``VmRSS``, and the peak ``VmHWM``, from /proc);
- **scrape duration**: ``scrape_duration_seconds`` of the fleet's targets: the average and largest
  of their last scrapes, the largest seen during the run (``max_over_time``) and the largest after
  the first round (the first scrape of a target creates all its series in the head: the slow one);
- **up**: ``count(up == 1)`` now, and how many targets had any failed scrape during the run;
  also how many targets had a scrape slower than 1 s, and the machine's load average (other
  work on a shared machine slows scrapes).

Limits: one process sends the *same* body for all N targets, so every pod has identical label
values and sample values; Prometheus's chunk encoding compresses constant values to almost nothing,
so its memory per series here is a lower bound for real pods, whose values differ and change. The
run is short (minutes: the head block holds everything, no compaction, no WAL replay). There is no
network: loopback only, no TLS, no service discovery; and the benchmark's server, the model and
Prometheus share the same CPUs, so scrape durations include that contention.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

CACHE_S = 1.0
# what Prometheus 2.42 sends (its scrape request); the library's answer to it is what we measure
PROM_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
               "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
CONFIGS: dict[str, dict[str, Any] | None] = {"full": None, "top": {"series": {"layers": "top"}}}


class Fail(Exception):
    """A one-line reason the benchmark cannot run."""


# --------------------------------------------------------------------------------------------
# the pod: an instrumented GPT-2 and the library's endpoint


def start_pod(config_name: str) -> tuple[Any, int, dict[str, Any] | None]:
    """Instrument a small GPT-2, run forwards, start monitoring; returns (library server, modules,
    the config passed: None for ``full`` where the library has no ``series`` section)."""
    import torch
    from transformers import GPT2Config, GPT2Model
    from transformers.utils import logging as hf_logging

    import memprof_otel as mp
    from memprof_otel.errors import ConfigError

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    model = GPT2Model(GPT2Config(n_layer=12, n_embd=256, n_head=4, vocab_size=1000)).eval()
    cfg = CONFIGS[config_name]
    if cfg is None and has_series_section():  # "all", not the fleet mode's "auto" (top in Kubernetes)
        cfg = {"series": {"layers": "all"}}
    try:
        mp.instrument(model, name="gpt2", config=cfg, every_n_forwards=1, overhead_budget=1.0)
        with torch.no_grad():
            for _ in range(4):
                model(torch.randint(0, 1000, (2, 16)))
        mp.start_monitoring(cfg)
    except ConfigError as e:
        if cfg is not None and "series" in str(e):
            raise Fail(f"--config {config_name}: this memprof_otel refuses the config section `series` "
                       f"({e}); the fleet mode has not landed here yet") from None
        raise
    server = mp.serve(port=0)
    modules = sum(1 for _ in model.modules())
    return server, modules, cfg


def has_series_section() -> bool:
    """Whether this memprof_otel knows the config section ``series`` (the fleet mode)."""
    from memprof_otel.config import Config
    return "series" in {f.name for f in dataclasses.fields(Config)}


# --------------------------------------------------------------------------------------------
# the fleet: one asyncio server per loopback address, all serving the library's cached body


class BodyCache:
    """The library's /metrics body per Accept header, re-fetched at most every CACHE_S seconds."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, bytes, str]] = {}
        self.renders = 0

    def peek(self, accept: str) -> tuple[bytes, str] | None:
        """The cached body if it is fresh (no lock: a dict read), else None."""
        hit = self._cache.get(accept)
        if hit is not None and time.monotonic() - hit[0] < CACHE_S:
            return hit[1], hit[2]
        return None

    def get(self, accept: str) -> tuple[bytes, str]:
        with self._lock:  # one fetch at a time; the others wait for it and share the result
            hit = self._cache.get(accept)
            if hit is not None and time.monotonic() - hit[0] < CACHE_S:
                return hit[1], hit[2]
            req = urllib.request.Request(self.url, headers={"Accept": accept})
            with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - our own loopback endpoint
                body, ctype = r.read(), r.headers.get("Content-Type", "text/plain; version=0.0.4")
            self.renders += 1
            self._cache[accept] = (time.monotonic(), body, ctype)
            return body, ctype


def fleet_addresses(n: int) -> list[str]:
    """127.0.0.2, 127.0.0.3, ... 127.0.0.254, 127.0.1.1, ...: N distinct loopback addresses."""
    out: list[str] = []
    x, y = 0, 2
    while len(out) < n:
        out.append(f"127.0.{x}.{y}")
        y += 1
        if y > 254:
            x, y = x + 1, 1
    return out


class Fleet:
    """N loopback listeners on one port, in an event loop on a background thread."""

    def __init__(self, addresses: list[str], port: int, cache: BodyCache) -> None:
        self.addresses, self.port, self.cache = addresses, port, cache
        self.requests = 0
        self.errors = 0
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fleet", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise Fail(f"cannot listen on the fleet's addresses: {self._error}")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.servers = self.loop.run_until_complete(self._listen())
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    async def _listen(self) -> list[asyncio.base_events.Server]:
        return [await asyncio.start_server(self._handle, a, self.port, backlog=64, reuse_address=True)
                for a in self.addresses]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # HTTP/1.1 keep-alive: Prometheus reuses one connection per target
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, *_ = lines[0].split(" ") + ["", ""]
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                if "content-length" in headers:
                    await reader.readexactly(int(headers["content-length"]))
                self.requests += 1
                if method == "GET" and path.split("?")[0] == "/metrics":
                    accept = headers.get("accept", "*/*")
                    hit = self.cache.peek(accept)  # a miss re-renders off the loop
                    body, ctype = hit or await self.loop.run_in_executor(None, self.cache.get, accept)
                    status = "200 OK"
                else:
                    body, ctype, status = b"not found\n", "text/plain", "404 Not Found"
                close = headers.get("connection", "").lower() == "close"
                writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                             f"{'Connection: close' if close else 'Connection: keep-alive'}\r\n\r\n"
                             .encode("latin-1") + body)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:  # noqa: BLE001 - counted; one bad connection must not stop the fleet
            self.errors += 1
        finally:
            writer.close()

    def stop(self) -> None:
        async def _close() -> None:
            for s in getattr(self, "servers", []):
                s.close()
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(_close(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


# --------------------------------------------------------------------------------------------
# Prometheus (the start/stop/ready pattern of tests/integration/support/prom_server.py, without pytest)


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None)
    if found is None:
        raise Fail("the prometheus binary is missing: install it with `apt-get install -y prometheus`")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - local servers only
        return bytes(r.read())


class Prometheus:
    def __init__(self, home: Path, targets: list[str], interval: float) -> None:
        self.home = home
        self.binary = prometheus_binary()
        self.targets, self.interval = targets, interval
        self.log_path = home / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=30)
        m = re.search(r"version (\S+)", out.stdout + out.stderr)
        return m.group(1) if m else "?"

    def start(self, ready_timeout: float = 60.0) -> None:
        (self.home / "data").mkdir(parents=True, exist_ok=True)
        for attempt in range(3):  # the free port may be taken between our probe and its bind
            port = free_port()
            interval = f"{self.interval:g}s"
            timeout = f"{min(self.interval, 10.0):g}s"
            cfg = {"global": {"scrape_interval": interval, "scrape_timeout": timeout, "evaluation_interval": interval},
                   "scrape_configs": [
                       {"job_name": "fleet", "metrics_path": "/metrics", "static_configs": [{"targets": self.targets}]},
                       {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}
            config = self.home / "prometheus.yml"
            config.write_text(json.dumps(cfg, indent=1))  # JSON is valid YAML
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.home / 'data'}",
                     f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h",
                     "--log.level=info"],
                    stdout=log, stderr=subprocess.STDOUT, cwd=self.home, start_new_session=True)
            self.url = f"http://127.0.0.1:{port}"
            if self._wait_ready(ready_timeout):
                return
            self.stop()
            if "address already in use" not in self.log_tail(200) or attempt == 2:
                raise Fail(f"prometheus did not become ready within {ready_timeout:g} s: "
                           f"{self.log_tail(3).replace(chr(10), ' | ')}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = json.loads(get(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"))
        if body.get("status") != "success":
            raise Fail(f"query {expr!r} failed: {body}")
        return list(body["data"]["result"])

    def scalar(self, expr: str) -> float | None:
        res = self.query(expr)
        return float(res[0]["value"][1]) if res else None

    def proc_status(self) -> dict[str, int]:
        """VmRSS and VmHWM (peak RSS) of the Prometheus process, in bytes."""
        assert self.proc is not None
        out: dict[str, int] = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, val = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(val.split()[0]) * 1024
        return out


# --------------------------------------------------------------------------------------------


def sample_lines(body: bytes) -> tuple[int, int]:
    """(sample lines, memprof_layer_* sample lines) of one exposition body."""
    n = layer = 0
    for line in body.decode("utf-8", errors="replace").splitlines():
        if not line or line.startswith("#"):
            continue
        n += 1
        if line.startswith("memprof_layer_"):
            layer += 1
    return n, layer


def raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < need:
        raise Fail(f"{need} file descriptors needed (N listeners + N connections), the limit is {soft}: "
                   "raise `ulimit -n` or lower --targets")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    raise_fd_limit(2 * args.targets + 256)
    addresses = fleet_addresses(args.targets)
    lib_server, modules, series_cfg = start_pod(args.config)
    cache = BodyCache(lib_server.url.rstrip("/") + "/metrics")
    body, ctype = cache.get(PROM_ACCEPT)
    per_target, layer_per_target = sample_lines(body)
    port = args.port or free_port()
    fleet = Fleet(addresses, port, cache)
    fleet.start()
    targets = [f"{a}:{port}" for a in addresses]
    home = Path(tempfile.mkdtemp(prefix="fleet-series-"))
    prom = Prometheus(home, targets, args.scrape_interval)
    header = (f"# fleet_series: prometheus {prom.version()}, torch {torch.__version__}, "
              f"python {platform.python_version()}, {os.cpu_count()} CPUs; {args.targets} targets on port {port}, "
              f"scrape every {args.scrape_interval:g} s, {args.duration:g} s, config {args.config}")
    print(header, flush=True)
    try:
        load_start = list(os.getloadavg())  # other work on the machine shows here
        prom.start()
        t0 = time.monotonic()
        duration = max(args.duration, 3 * args.scrape_interval + 5)
        if duration > args.duration:
            print(f"# duration raised to {duration:g} s: at least 3 scrape rounds", flush=True)
        while True:
            time.sleep(min(5.0, max(0.0, t0 + duration - time.monotonic())))
            if prom.proc is not None and prom.proc.poll() is not None:
                raise Fail(f"prometheus exited ({prom.proc.returncode}): {prom.log_tail(3)}")
            if time.monotonic() - t0 >= duration:
                break
        elapsed = time.monotonic() - t0
        rng = f"[{int(elapsed) + 1}s]"
        # the rounds after the first (which creates every series in the head): steady state
        later = f"[{max(1, int(elapsed - args.scrape_interval - 2))}s]"
        fleet_sel = '{job="fleet"}'
        rounds = prom.scalar(f"min(count_over_time(up{fleet_sel}{rng}))")
        ps = prom.proc_status()
        end_body, _ = cache.get(PROM_ACCEPT)  # the body as of now: series may appear after the first ticks
        per_target_end, layer_per_target_end = sample_lines(end_body)
        res = {
            "date": time.strftime("%Y-%m-%d"),
            "config": args.config, "series_config": series_cfg,
            "targets": args.targets, "scrape_interval_s": args.scrape_interval, "duration_s": round(duration, 1),
            "scrape_rounds_min": rounds,
            "model_modules": modules,
            "body_bytes": len(end_body), "content_type": ctype,
            "series_per_target": per_target_end, "layer_series_per_target": layer_per_target_end,
            "series_per_target_at_start": per_target, "layer_series_per_target_at_start": layer_per_target,
            "scrape_samples_scraped_avg": prom.scalar(f"avg(scrape_samples_scraped{fleet_sel})"),
            "head_series": prom.scalar('prometheus_tsdb_head_series{job="prometheus"}'),
            "memprof_series": prom.scalar('count({__name__=~"memprof_.*"})'),
            "memprof_layer_series": prom.scalar('count({__name__=~"memprof_layer_.*"})'),
            "prometheus_rss_bytes": ps.get("VmRSS"), "prometheus_peak_rss_bytes": ps.get("VmHWM"),
            "prometheus_rss_self_scraped_bytes": prom.scalar('process_resident_memory_bytes{job="prometheus"}'),
            "scrape_duration_avg_s": prom.scalar(f"avg(scrape_duration_seconds{fleet_sel})"),
            "scrape_duration_max_s": prom.scalar(f"max(scrape_duration_seconds{fleet_sel})"),
            "scrape_duration_max_run_s": prom.scalar(f"max(max_over_time(scrape_duration_seconds{fleet_sel}{rng}))"),
            "scrape_duration_max_after_first_round_s": prom.scalar(
                f"max(max_over_time(scrape_duration_seconds{fleet_sel}{later}))"),
            "targets_with_scrape_over_1s_after_first_round": prom.scalar(
                f"count(max_over_time(scrape_duration_seconds{fleet_sel}{later}) > 1)") or 0,
            "targets_with_scrape_over_1s": prom.scalar(
                f"count(max_over_time(scrape_duration_seconds{fleet_sel}{rng}) > 1)") or 0,
            "up": prom.scalar(f"count(up{fleet_sel} == 1)") or 0,
            "targets_ever_down": prom.scalar(f"count(min_over_time(up{fleet_sel}{rng}) == 0)") or 0,
            "loadavg_start": load_start, "loadavg_end": list(os.getloadavg()),
            "fleet_requests": fleet.requests, "fleet_errors": fleet.errors, "library_renders": cache.renders,
            "versions": {"prometheus": prom.version(), "torch": torch.__version__,
                         "python": platform.python_version(), "cpus": os.cpu_count()},
        }
    finally:
        prom.stop()
        fleet.stop()
        lib_server.close()
        shutil.rmtree(home, ignore_errors=True)
    return res


def fmt(r: dict[str, Any]) -> str:
    def n(v: Any) -> str:
        return "?" if v is None else f"{v:,.0f}"

    def ms(v: Any) -> str:
        return "?" if v is None else f"{v * 1e3:.1f} ms"

    def gib(v: Any) -> str:
        return "?" if v is None else f"{v / 2**30:.2f} GiB"

    return (f"{r['config']:<5} targets {r['targets']:,}  series/target {r['series_per_target']:,} "
            f"(layer {r['layer_series_per_target']:,}, Prometheus saw {n(r['scrape_samples_scraped_avg'])})  "
            f"head series {n(r['head_series'])}  memprof {n(r['memprof_series'])}  "
            f"per-layer {n(r['memprof_layer_series'])}  RSS {gib(r['prometheus_rss_bytes'])} "
            f"(peak {gib(r['prometheus_peak_rss_bytes'])})  scrape avg {ms(r['scrape_duration_avg_s'])} "
            f"max {ms(r['scrape_duration_max_s'])} (run max {ms(r['scrape_duration_max_run_s'])}, "
            f"{n(r['targets_with_scrape_over_1s'])} targets > 1 s; after the first round max "
            f"{ms(r['scrape_duration_max_after_first_round_s'])}, "
            f"{n(r['targets_with_scrape_over_1s_after_first_round'])} > 1 s)  "
            f"up {n(r['up'])}/{r['targets']:,} (ever down {n(r['targets_ever_down'])})  "
            f"rounds {n(r['scrape_rounds_min'])}  load {r['loadavg_start'][0]:.1f}->{r['loadavg_end'][0]:.1f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--targets", type=int, default=1000, help="pods simulated (distinct loopback addresses)")
    p.add_argument("--config", choices=sorted(CONFIGS), default="full",
                   help='full: every layer exported (default config); top: {"series": {"layers": "top"}}')
    p.add_argument("--scrape-interval", type=float, default=15.0, help="seconds between scrapes of a target")
    p.add_argument("--duration", type=float, default=90.0, help="seconds Prometheus scrapes before the figures")
    p.add_argument("--port", type=int, default=0, help="the fleet's port on every address (0: a free one)")
    p.add_argument("--json", type=Path, default=None, help="write the figures to this JSON file")
    args = p.parse_args(argv)
    if not 1 <= args.targets <= 60_000:
        p.error("--targets must be in 1..60000")
    if args.scrape_interval <= 0 or args.duration <= 0:
        p.error("--scrape-interval and --duration must be positive")
    try:
        res = run(args)
    except Fail as e:
        print(f"fleet_series: error: {e}", file=sys.stderr)
        return 2
    print(fmt(res), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
