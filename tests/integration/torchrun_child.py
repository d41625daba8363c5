"""One rank of a distributed job for tests/integration/test_torchrun_ranks.py (``torchrun
--standalone --nproc_per_node=2 tests/integration/torchrun_child.py``), or a plain process when
started without torchrun (no ``RANK``).

Each rank builds its own small model, instruments it, serves the endpoint with the default port
(``MEMPROF_OTEL_HTTP_PORT``, the base the test picked) and runs forwards until the file named by
``MEMPROF_TEST_STOP_FILE`` exists. Every step all-reduces the step's output and the stop flag over
gloo, so the ranks really cooperate and stop at the same step (a rank that left early would leave
its peer waiting in the collective). Prints one line when serving:
``READY rank=<RANK> local_rank=<LOCAL_RANK> port=<port> url=<url>``."""
from __future__ import annotations

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
    stop = Path(os.environ["MEMPROF_TEST_STOP_FILE"])
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
            done = torch.tensor([float(stop.exists())])
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
