"""The processes of the post-mortem history tests.

    python -m tests.integration.support.history_child serve [BATCH,SEQ] [-option ...]
    python SCRIPT serve ...     (SCRIPT: another file that calls ``main(sys.argv[1:])``)

Instruments a small token model (every forward attributed, sampler every ``INTERVAL_S``), serves
memprof-otel's endpoint on a free port and prints ``url <URL>``. With no shape it then waits,
idle, until its stdin closes, and shuts down cleanly. With a shape it runs a few forwards of other
shapes for ``WARM_S``, prints ``long <pid>`` and starts one forward of shape ``BATCH x SEQ`` that
stays in layer ``blocks.1`` (sleeping, so it costs no CPU) until the test kills the process.

Arguments starting with ``-`` are ignored here (they exist so that a test can pass options, which
the service key of an unnamed service leaves out). Everything else comes from the environment:
``MEMPROF_OTEL_BLACKBOX_DIR``, ``MEMPROF_OTEL_SERVICE_NAME``, ``MEMPROF_OTEL_BLACKBOX_KEEP``,
``TMPDIR``, ...
"""
from __future__ import annotations

import os
import sys
import time

INTERVAL_S = 0.1
WARM_S = 1.0
WARM_SHAPES = [(1, 8), (2, 16), (4, 32)]


def main(args: list[str]) -> None:
    if args[:1] != ["serve"]:
        raise SystemExit(__doc__)
    import torch

    import memprof_otel as mp
    from tests.integration.support.token_model import TokenModel

    torch.set_num_threads(1)
    model = TokenModel()
    mp.instrument(model, name="victim", every_n_forwards=1, overhead_budget=1.0,
                  config={"sampler": {"interval": INTERVAL_S}})
    srv = mp.serve(port=0)
    print(f"url {srv.url}", flush=True)
    shape = next((a for a in args[1:] if not a.startswith("-")), None)
    if shape is None:
        sys.stdin.read()
        mp.shutdown()
        return
    batch, seq = (int(x) for x in shape.split(","))
    end = time.monotonic() + WARM_S
    i = 0
    with torch.no_grad():
        while time.monotonic() < end:
            model(torch.randint(0, 100, WARM_SHAPES[i % len(WARM_SHAPES)]))
            i += 1
            time.sleep(0.01)
        model.blocks[1].stuck.set()
        print(f"long {os.getpid()}", flush=True)
        model(torch.randint(0, 100, (batch, seq)))
    print("the long forward ended", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
