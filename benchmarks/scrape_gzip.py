"""What gzip does to a /metrics scrape of a 1,000-layer model: bytes on the wire and CPU time.

    python -m benchmarks.scrape_gzip               # 1,000 layers (~1 min)
    python -m benchmarks.scrape_gzip --quick       # fewer pairs (smoke run)

The model is the one ``benchmarks.scrape_cost`` builds (N ``Linear(8, 8)``, every layer with
stats). Sizes: the body ``Endpoint.handle`` returns for text 0.0.4 and OpenMetrics, with and
without ``Accept-Encoding: gzip`` (the endpoint's level, 1), and the same text body compressed at
levels 6 and 9 for comparison. Time: paired, interleaved blocks of scrapes (``benchmarks._paired``,
the calling thread's CPU time) — plain against gzip, and an A/A control (plain against plain) that
shows the noise floor; and level 1 against level 9 on the compression alone.
"""
from __future__ import annotations

import argparse
import gzip
import os
import platform
import sys
import time

import torch

import memprof_otel as mp
from memprof_otel.http.app import GZIP_LEVEL, Endpoint, Request
from memprof_otel.runtime import runtime

from ._paired import paired
from .scrape_cost import OPENMETRICS, build


def kib(n: int) -> str:
    return f"{n / 1024:,.1f} KiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    pairs, block = (6, 5) if args.quick else (30, 10)
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus, {platform.machine()}, python "
          f"{sys.version.split()[0]}, memprof_otel {mp.__version__}; load average {os.getloadavg()[0]:.2f}")
    mp.start_monitoring({"sampler": {"interval": "1s"}})
    ep = Endpoint(runtime())
    _, h = build(args.layers)

    def scrape(headers: dict[str, str]) -> bytes:
        resp = ep.handle(Request("GET", "/metrics", headers=headers))
        assert resp.status == 200, resp.body[:200]
        return resp.body

    text = scrape({})
    om = scrape({"accept": OPENMETRICS})
    text_gz = scrape({"accept-encoding": "gzip"})
    om_gz = scrape({"accept": OPENMETRICS, "accept-encoding": "gzip"})
    assert gzip.decompress(text_gz).count(b"\n") == text.count(b"\n")  # same exposition, compressed
    print(f"\n{args.layers} layers, bytes per scrape:")
    print(f"  text 0.0.4        {kib(len(text)):>12}   gzip (level {GZIP_LEVEL}) {kib(len(text_gz)):>11}  "
          f"x{len(text) / len(text_gz):.1f} smaller")
    print(f"  OpenMetrics       {kib(len(om)):>12}   gzip (level {GZIP_LEVEL}) {kib(len(om_gz)):>11}  "
          f"x{len(om) / len(om_gz):.1f} smaller")
    for level in (6, 9):
        n = len(gzip.compress(text, compresslevel=level))
        print(f"  text at level {level}                    {kib(n):>11}  x{len(text) / n:.1f} smaller")

    def plain() -> None:
        scrape({})

    def zipped() -> None:
        scrape({"accept-encoding": "gzip"})

    clock = time.thread_time  # the thread's CPU time: other processes on a shared machine do not inflate it
    print(f"\npaired CPU time of a scrape ({pairs} pairs x {block}):")
    print("  " + paired("A/A control: plain vs plain", plain, lambda: plain(), pairs=pairs, block=block, clock=clock).row())
    print("  " + paired("plain vs gzip (the endpoint)", plain, zipped, pairs=pairs, block=block, clock=clock).row())
    print("  " + paired("compress only: level 1 vs 9", lambda: gzip.compress(text, compresslevel=1),
                        lambda: gzip.compress(text, compresslevel=9), pairs=pairs, block=block, clock=clock).row())
    h.uninstrument()
    mp.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
