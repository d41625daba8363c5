"""What one Prometheus scrape of /metrics costs, by the number of instrumented layers.

    python -m benchmarks.scrape_cost                # 10, 100, 1,000 layers (~1 min)
    python -m benchmarks.scrape_cost --quick        # fewer scrapes (smoke run)
    python -m benchmarks.scrape_cost --profile      # also cProfile the largest model's scrapes

For each N, an ``nn.Sequential`` of N ``Linear(8, 8)`` is instrumented with ``max_layers`` > N,
``every_n_forwards=1, overhead_budget=1.0`` and run a few times, so every layer has stats and
window peaks (N+1 layer label sets: the root too). Then /metrics is rendered many times:

- **direct**: ``Endpoint.handle(Request("GET", "/metrics"))``, the transport-free handler, in the
  Prometheus text format (0.0.4) and in OpenMetrics (what Prometheus asks for first by default);
- **HTTP**: ``GET /metrics`` over a real TCP connection to ``memprof_otel.serve()`` with
  ``http.client`` (one connection per scrape: the stdlib server speaks HTTP/1.0).

Also the parts: ``ScrapeView.series()`` (the shared data path), ``ScrapeView.layer_views()`` and the
collector's ``collect()``; the rest of the direct time is prometheus_client's text encoding. Ratios
are against the same scrape with no model instrumented (N = 0), run in the same process.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import http.client
import io
import json
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.http.app import Endpoint, Request
from memprof_otel.runtime import runtime

GOAL_S = 0.010  # at 1,000 layers
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def timed(fn: Callable[[], Any], n: int, warmup: int = 3) -> tuple[list[float], Any]:
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def stats(times: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(times), "p95_s": pct(times, 0.95), "mean_s": statistics.fmean(times),
            "min_s": min(times), "n": len(times)}


class GcWatch:
    """Counts the garbage collections (and their time) that happen while it is ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.runs = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._t0 = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            g = info["generation"]
            self.runs[g] += 1
            self.seconds[g] += time.perf_counter() - self._t0

    def measure(self, fn: Callable[[], Any], n: int) -> tuple[list[float], Any, dict[str, Any]]:
        self.runs, self.seconds = [0, 0, 0], [0.0, 0.0, 0.0]
        self.on = True
        try:
            times, out = timed(fn, n)
        finally:
            self.on = False
        return times, out, {"collections": list(self.runs), "seconds": list(self.seconds), "scrapes": n}


def generic_scrape(registry: Any) -> bytes:
    """The scrape as it was before the fast layer writer: every family through prometheus_client."""
    from prometheus_client.exposition import generate_latest

    return generate_latest(registry)


def build(n_layers: int) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(n_layers)]).eval()
    h = mp.instrument(model, name=f"seq{n_layers}", max_layers=n_layers + 1, every_n_forwards=1,
                      overhead_budget=1.0)
    x = torch.randn(4, 8)
    with torch.inference_mode():
        for _ in range(3):
            model(x)
    return model, h


def http_get(port: int, accept: str | None) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"/metrics answered {resp.status}: {body[:200]!r}")
        return body
    finally:
        conn.close()


def measure(n_layers: int, ep: Endpoint, port: int, scrapes: int, watch: GcWatch) -> dict[str, Any]:
    rt = runtime()
    h = None
    if n_layers:
        _, h = build(n_layers)
        assert len(h.layer_stats()) == n_layers + 1, (len(h.layer_stats()), n_layers)
    text_req = Request("GET", "/metrics", headers={})
    om_req = Request("GET", "/metrics", headers={"accept": OPENMETRICS})
    direct, resp, gcs = watch.measure(lambda: ep.handle(text_req), scrapes)
    assert resp.status == 200, resp.body[:200]
    body = resp.body
    direct_om, resp_om = timed(lambda: ep.handle(om_req), scrapes)
    over_http, http_body = timed(lambda: http_get(port, None), scrapes)
    over_http_om, _ = timed(lambda: http_get(port, OPENMETRICS), scrapes)
    collector = next(iter(ep.registry._collector_to_names))  # type: ignore[attr-defined]
    t_series, _ = timed(lambda: rt.scrape.series(max_age_s=0.0), scrapes)
    t_views, _ = timed(rt.scrape.layer_views, scrapes)
    t_collect, fams = timed(lambda: list(collector.collect()), scrapes)
    from memprof_otel.export.prometheus import make_registry

    full = make_registry(rt.scrape)  # layers through prometheus_client too: the path before the fast writer
    generic_body = generic_scrape(full)
    def layer_lines_of(b: bytes) -> list[bytes]:  # other families' values move between two scrapes
        return sorted(x for x in b.splitlines() if x.lstrip(b"# HELPTYE").startswith(b"memprof_layer_"))
    same = layer_lines_of(generic_body) == layer_lines_of(body)
    t_generic, _, gcs_generic = watch.measure(lambda: generic_scrape(full), scrapes)
    layer_lines = sum(1 for line in body.splitlines() if line.startswith(b"memprof_layer_"))
    out = {"layers": n_layers, "label_sets": n_layers + 1 if n_layers else 0,
           "direct_text": stats(direct), "direct_openmetrics": stats(direct_om),
           "http_text": stats(over_http), "http_openmetrics": stats(over_http_om),
           "gc_direct_text": gcs, "generic_text": stats(t_generic), "gc_generic": gcs_generic,
           "same_lines_as_generic": same,
           "series": stats(t_series), "layer_views": stats(t_views), "collect": stats(t_collect),
           "bytes_text": len(body), "bytes_openmetrics": len(resp_om.body), "bytes_http": len(http_body),
           "samples": sum(len(f.samples) for f in fams), "lines": body.count(b"\n"),
           "layer_lines": layer_lines}
    if h is not None:
        h.uninstrument()
    return out


def profile(n_layers: int, ep: Endpoint, scrapes: int, path: str | None) -> str:
    _, h = build(n_layers)
    req = Request("GET", "/metrics", headers={})
    ep.handle(req)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(scrapes):
        ep.handle(req)
    prof.disable()
    h.uninstrument()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(20)
    st.sort_stats("cumulative").print_stats(30)
    if path:
        prof.dump_stats(path)
    return buf.getvalue()


def fmt_ms(s: float) -> str:
    return f"{s * 1e3:7.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer scrapes (smoke run)")
    ap.add_argument("--layers", default="10,100,1000")
    ap.add_argument("--scrapes", type=int, help="scrapes per measurement (default 200, quick 30)")
    ap.add_argument("--profile", action="store_true", help="cProfile scrapes of the largest model")
    ap.add_argument("--profile-out", help="write the cProfile stats here (with --profile)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    scrapes = args.scrapes or (30 if args.quick else 200)
    import prometheus_client

    print(f"torch {torch.__version__}, {os.cpu_count()} cpus, {platform.machine()}, python "
          f"{sys.version.split()[0]}, memprof_otel {mp.__version__}, prometheus_client "
          f"{getattr(prometheus_client, '__version__', '?')}; {scrapes} scrapes each")
    print(f"load average at start {os.getloadavg()[0]:.2f}")
    mp.start_monitoring({"sampler": {"interval": "1s"}})
    srv = mp.serve(host="127.0.0.1", port=0)
    ep = Endpoint(runtime())
    watch = GcWatch()
    results = [measure(0, ep, srv.port, scrapes, watch)]
    for n in (int(x) for x in args.layers.split(",")):
        results.append(measure(n, ep, srv.port, scrapes, watch))
    base = results[0]["direct_text"]["median_s"]
    print(f"\n{'layers':>6} {'bytes (text)':>12} {'samples':>8} | {'direct text':>18} | {'direct OpenMetrics':>18} | "
          f"{'HTTP text':>18} | {'HTTP OpenMetrics':>18} | {'series':>7} {'views':>7} {'collect':>7} | "
          f"{'vs N=0':>7}")
    print(f"{'':>6} {'':>12} {'':>8} | {'median / p95 ms':>18} | {'median / p95 ms':>18} | {'median / p95 ms':>18} | "
          f"{'median / p95 ms':>18} | {'ms':>7} {'ms':>7} {'ms':>7} |")
    for r in results:
        cols = []
        for k in ("direct_text", "direct_openmetrics", "http_text", "http_openmetrics"):
            cols.append(f"{fmt_ms(r[k]['median_s'])} / {fmt_ms(r[k]['p95_s'])}")
        print(f"{r['layers']:>6} {r['bytes_text']:>12,} {r['samples']:>8,} | " + " | ".join(f"{c:>18}" for c in cols)
              + f" | {fmt_ms(r['series']['median_s'])} {fmt_ms(r['layer_views']['median_s'])} "
                f"{fmt_ms(r['collect']['median_s'])} | x{r['direct_text']['median_s'] / base:6.1f}")
    print(f"\ngarbage collections during the {scrapes} direct text scrapes (full = generation 2), against "
          f"the generic path (every family through prometheus_client's encoder, as before the fast writer):")
    print(f"{'layers':>6} | {'mean ms':>8} {'gen0/1/2 runs':>15} {'full GC ms total':>17} | {'generic median / p95 / mean ms':>34} "
          f"{'gen2':>5} {'same layer lines':>17}")
    for r in results:
        g, gp = r["gc_direct_text"], r["gc_generic"]
        p = r["generic_text"]
        print(f"{r['layers']:>6} | {r['direct_text']['mean_s'] * 1e3:8.2f} {'/'.join(map(str, g['collections'])):>15} "
              f"{g['seconds'][2] * 1e3:17.1f} | {fmt_ms(p['median_s'])} / {fmt_ms(p['p95_s'])} / {fmt_ms(p['mean_s']):>8}"
              f"{'':>6}{gp['collections'][2]:>5} {str(r['same_lines_as_generic']):>17}")
    big = results[-1]
    if len(results) > 2:
        small = results[1]
        per_layer = (big["direct_text"]["median_s"] - small["direct_text"]["median_s"]) / (big["layers"] - small["layers"])
        print(f"\nmarginal cost per layer (direct, text): {per_layer * 1e6:.1f} us; "
              f"{(big['bytes_text'] - small['bytes_text']) / (big['layers'] - small['layers']):.0f} bytes")
    verdict = "MEETS" if max(big["direct_text"]["median_s"], big["http_text"]["median_s"]) <= GOAL_S else "MISSES"
    print(f"goal <= {GOAL_S * 1e3:g} ms at {big['layers']} layers: {verdict} (direct median "
          f"{big['direct_text']['median_s'] * 1e3:.2f} ms, HTTP median {big['http_text']['median_s'] * 1e3:.2f} ms, "
          f"p95 {big['direct_text']['p95_s'] * 1e3:.2f} / {big['http_text']['p95_s'] * 1e3:.2f} ms)")
    # application-side mitigation of the full collections: freeze the start-up heap
    _, h = build(big["layers"])
    gc.collect()
    gc.freeze()
    frozen_t, _, frozen_gc = watch.measure(lambda: ep.handle(Request("GET", "/metrics")), scrapes)
    gc.unfreeze()
    h.uninstrument()
    frozen = {"layers": big["layers"], **stats(frozen_t), "gc": frozen_gc}
    print(f"with gc.freeze() after start-up ({big['layers']} layers): median {frozen['median_s'] * 1e3:.2f} ms, p95 "
          f"{frozen['p95_s'] * 1e3:.2f} ms, mean {frozen['mean_s'] * 1e3:.2f} ms, gen0/1/2 "
          f"{'/'.join(map(str, frozen_gc['collections']))}, full GC {frozen_gc['seconds'][2] * 1e3:.1f} ms total")
    print(f"objects tracked by the GC in this process: {len(gc.get_objects()):,}; load average at the end "
          f"{os.getloadavg()[0]:.2f}")
    prof_text = None
    if args.profile:
        prof_text = profile(big["layers"], ep, max(10, scrapes // 5), args.profile_out)
        print("\n" + prof_text)
    srv.close()
    mp.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scrapes": scrapes, "goal_s": GOAL_S, "results": results, "verdict": verdict,
                       "gc_freeze": frozen}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
