"""The leaking process of the early-warning test.

    python -m tests.integration.leak_child

Starts memprof-otel's monitoring (sampler every ``INTERVAL_S``) and its endpoint on a free port,
prints the endpoint's URL, then waits for a line on stdin. From then on it keeps ``CHUNK_BYTES``
more memory every ``STEP_S``, each chunk written so that its pages are charged to the cgroup,
until the kernel kills it. No model: what the early warning reads is the cgroup's, and a framework
would only raise the floor the leak starts from.
"""
from __future__ import annotations

import sys
import time

INTERVAL_S = 0.1
CHUNK_BYTES = 2 << 20   # 2 MiB every 100 ms: 20 MiB/s
STEP_S = 0.1


def main() -> None:
    import memprof_otel as mp

    mp.start_monitoring({"sampler": {"interval": INTERVAL_S}})
    srv = mp.serve(port=0)
    print(srv.url, flush=True)
    sys.stdin.readline()
    kept = []
    next_t = time.monotonic()
    while True:
        kept.append(b"\x01" * CHUNK_BYTES)  # filled, so resident (bytes(n) would map zero pages lazily)
        next_t += STEP_S
        time.sleep(max(0.0, next_t - time.monotonic()))


if __name__ == "__main__":
    main()
