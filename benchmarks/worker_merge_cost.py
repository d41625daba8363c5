"""What a single-port scrape (``workers.snapshot_dir``) costs the answering worker, by worker count.

    python -m benchmarks.worker_merge_cost            # 100 and 1,000 layers x 2, 4, 8 workers (~2 min)
    python -m benchmarks.worker_merge_cost --quick    # fewer pairs (smoke run; noisy)

One process is instrumented like ``benchmarks.scrape_cost`` (an ``nn.Sequential`` of N
``Linear(8, 8)``, every layer with stats and window peaks); the other workers are W-1 live
processes (``sleep``) whose files in the snapshot folder are copies of this process's own
exposition, so each worker weighs the same. Paired, alternating blocks (order flipped every pair):

- **plain**: this process's own scrape, as without ``workers.snapshot_dir`` (OpenMetrics, what
  Prometheus asks for);
- **merged**: what ``GET /metrics`` does in single-port mode: the same own scrape, then the other
  workers' files read and merged (OpenMetrics: a text merge);
- **A/A control**: plain against plain (this machine's noise floor).

Also, unpaired: the merged scrape in the Prometheus text format (0.0.4), which goes through
prometheus_client's parser and encoder — for clients other than Prometheus.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.export.exposition_merge import OPENMETRICS
from memprof_otel.export.prometheus import make_registry, render_exposition
from memprof_otel.export.worker_snapshots import render_all_workers, stale_after_s
from memprof_otel.runtime import runtime

from ._paired import paired


def build(n_layers: int) -> object:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(n_layers)]).eval()
    h = mp.instrument(model, name=f"seq{n_layers}", max_layers=n_layers + 1, every_n_forwards=1,
                      overhead_budget=1.0)
    with torch.inference_mode():
        for _ in range(3):
            model(torch.randn(4, 8))
    return h


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--layers", default="100,1000")
    ap.add_argument("--workers", default="2,4,8")
    args = ap.parse_args(argv)
    pairs, block = (6, 2) if args.quick else (20, 3)
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus, {platform.machine()}, python "
          f"{sys.version.split()[0]}, memprof_otel {mp.__version__}; {pairs} pairs x {block} scrapes")
    print(f"load average at start {os.getloadavg()[0]:.2f}")
    folder = tempfile.mkdtemp(prefix="memprof-merge-bench-")
    mp.start_monitoring({"sampler": {"interval": "1s"}})
    rt = runtime().scrape
    registry = make_registry(rt, layers=False)
    stale = stale_after_s(3600.0, 1.0)  # the copies are never rewritten: keep them
    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(max(int(w) for w in args.workers.split(",")))]
    try:
        print(f"\n{'layers':>6} {'workers':>7} | {'plain ms':>8} | {'merged ms':>9} | {'ratio (IQR)':>22} | "
              f"{'A/A':>7} | {'text 0.0.4 merged ms':>20}")
        for n in (int(x) for x in args.layers.split(",")):
            h = build(n)
            own = render_exposition(rt, registry, OPENMETRICS)[0]

            def plain() -> None:
                render_exposition(rt, registry, OPENMETRICS)

            def plain_too() -> None:  # a distinct function: paired() tells its two sides apart by identity
                render_exposition(rt, registry, OPENMETRICS)

            aa = paired("aa", plain, plain_too, pairs=pairs, block=block)
            for w in (int(x) for x in args.workers.split(",")):
                for f in os.listdir(folder):
                    os.unlink(os.path.join(folder, f))
                for s in sleepers[: w - 1]:
                    with open(os.path.join(folder, f"{s.pid}.om"), "wb") as fh:
                        fh.write(own)

                def merged(accept: str = OPENMETRICS) -> None:
                    body = render_exposition(rt, registry, OPENMETRICS)[0]
                    render_all_workers(body, folder, stale, accept)

                r = paired("merged", plain, merged, pairs=pairs, block=block)
                text_times = []
                for _ in range(3 if args.quick else 5):
                    t0 = time.perf_counter()
                    merged("text/plain; version=0.0.4")
                    text_times.append(time.perf_counter() - t0)
                print(f"{n:>6} {w:>7} | {r.plain_s * 1e3:>8.2f} | {r.plain_s * r.median_ratio * 1e3:>9.2f} | "
                      f"{r.median_ratio:>6.2f}x [{r.ci_low:.2f}, {r.ci_high:.2f}] | {aa.median_ratio:>6.3f}x | "
                      f"{statistics.median(text_times) * 1e3:>20.1f}")
            h.uninstrument()  # type: ignore[attr-defined]
    finally:
        for s in sleepers:
            s.kill()
            s.wait()
        mp.shutdown(3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
