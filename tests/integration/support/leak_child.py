"""The leaking process of the early-warning test.

    python -m tests.integration.support.leak_child

Instruments a small torch model (sampler every ``INTERVAL_S``), serves the endpoint on a free
port, prints its URL, then waits for a line on stdin. From then on, every ``STEP_S``, it runs a
forward and keeps ``CHUNK_BYTES`` more memory (written, so that its pages are charged to the
cgroup), until the kernel kills it: a server with a leak outside the model.
"""
from __future__ import annotations

import sys
import time

INTERVAL_S = 0.1
CHUNK_BYTES = 2 << 20   # 2 MiB every 100 ms: 20 MiB/s
STEP_S = 0.1


def main() -> None:
    import torch

    import memprof_otel as mp

    model = torch.nn.Linear(64, 64)
    mp.instrument(model, name="leaky", config={"sampler": {"interval": INTERVAL_S}})
    srv = mp.serve(port=0)
    print(srv.url, flush=True)
    sys.stdin.readline()
    kept = []
    next_t = time.monotonic()
    while True:
        with torch.no_grad():
            model(torch.ones(8, 64))
        kept.append(b"\x01" * CHUNK_BYTES)  # filled, so resident (bytes(n) would map zero pages lazily)
        next_t += STEP_S
        time.sleep(max(0.0, next_t - time.monotonic()))


if __name__ == "__main__":
    main()
