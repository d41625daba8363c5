"""memprof-otel in a distributed job started by ``torchrun``: each rank instruments its own model and
serves its own series, told apart by a ``rank`` label.

    MEMPROF_OTEL_HTTP_PORT=9464 torchrun --standalone --nproc_per_node=2 examples/torchrun_ranks.py
    curl -s localhost:9464/metrics | grep 'memprof_layer_peak_increase_bytes'   # rank="0"
    curl -s localhost:9465/metrics | grep 'memprof_layer_peak_increase_bytes'   # rank="1"

Each rank builds a small model, instruments it and serves the endpoint: rank ``LOCAL_RANK`` on
``http.port + LOCAL_RANK``, so the ranks of one host never collide. Every step all-reduces the
step's output and a stop flag over gloo (CPU), so the ranks really cooperate and stop at the same
step: a rank that left early would leave its peer waiting in the collective. It runs until the file
named by ``--stop-file`` exists, or until Ctrl-C. Started without torchrun it is a plain process
(no ``rank`` label). Prints one line when serving:
``READY rank=<RANK> local_rank=<LOCAL_RANK> port=<port> url=<url>``, and ``STOPPED rank=<RANK>``.
``tests/integration/test_torchrun_ranks.py`` runs it under torchrun with a real Prometheus.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import memprof_otel as mp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stop-file", type=Path, default=None, help="stop once this file exists")
    stop: Path | None = ap.parse_args().stop_file
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank() if distributed else -1
    torch.manual_seed(max(rank, 0))
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 16))
    mp.instrument(model, name="ranked")
    server = mp.serve()
    print(f"READY rank={os.environ.get('RANK', '-')} local_rank={os.environ.get('LOCAL_RANK', '-')} "
          f"port={server.port} url={server.url}", flush=True)
    x = torch.randn(32, 64)
    with torch.no_grad():
        while True:
            out = model(x)
            done = torch.tensor([float(stop is not None and stop.exists())])
            if distributed:
                total = out.sum().reshape(1)
                dist.all_reduce(total)          # the ranks' outputs, summed: one collective per step
                dist.all_reduce(done, op=dist.ReduceOp.MAX)  # any rank told to stop stops them all
            if done.item() > 0:
                break
            time.sleep(0.05)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    server.close()
    mp.shutdown()
    print(f"STOPPED rank={os.environ.get('RANK', '-')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
