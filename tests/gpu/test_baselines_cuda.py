"""Baselines on a real CUDA device: the same model and inputs in fresh processes give the same
per-layer figures (the caching allocator's, in its block sizes), to the byte; a failure prints the
largest difference per layer, the figure docs/reference.md's "Baselines" must then state."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from memprof_otel.baselines import diff, loads
from memprof_otel.baselines.render import text
from tests.integration.support.demo_process import REPO

pytestmark = pytest.mark.timeout(600)

RUNS = 5

CHILD = textwrap.dedent('''
    import sys
    import torch
    import memprof_otel as mp
    from tests.integration.support.baseline_models import Net, inputs

    torch.manual_seed(0)
    model = Net().cuda()
    h = mp.instrument(model, name="net")
    x = inputs().cuda()
    with torch.inference_mode():
        model(x)  # warm-up: cuBLAS's workspace and the allocator's first segments are not the model's
        b = h.baseline(x)
    sys.stdout.write(b.dumps())
''')


def _child() -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=180, cwd=REPO,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_cuda_baselines_are_the_same_run_to_run() -> None:
    outputs = [_child() for _ in range(RUNS)]
    first = loads(outputs[0])
    assert first.environment["device"].startswith("cuda") and first.environment.get("cuda")
    for other in outputs[1:]:
        d = diff(first, loads(other))
        assert not d.changes, text(d)
