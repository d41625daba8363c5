"""The layers dashboard's "by service version" panel on a real Prometheus: two processes of a
service, the old version and a new one whose second block is wider (a deploy that grew one layer),
each with its service.version in OTEL_RESOURCE_ATTRIBUTES. The panel's own query, as the generated
dashboard has it, splits each layer by version, and the grown layer's two lines differ by what the
wider block allocates."""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.assets.asset_queries import VARIABLE_VALUES, substitute_variables
from tests.integration.support.baseline_models import BATCH, F32, HIDDEN
from tests.integration.support.demo_process import REPO
from tests.integration.support.prom_server import running_prometheus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PANEL = "Per-layer peak increase by service version"
WIDER = HIDDEN + 10

SERVER = textwrap.dedent('''
    import sys, threading
    import torch
    import memprof_otel as mp
    from tests.integration.support.baseline_models import HIDDEN, Net, inputs

    torch.manual_seed(0)
    model = Net(hidden=(HIDDEN, int(sys.argv[1]), HIDDEN))
    mp.instrument(model, name="net", every_n_forwards=1, overhead_budget=1.0)
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            with torch.inference_mode():
                model(inputs())
            stop.wait(0.05)

    threading.Thread(target=traffic, daemon=True).start()
    srv = mp.serve(port=0)
    print(srv.url, flush=True)
    sys.stdin.read()
    stop.set()
    mp.shutdown()
''')


@contextmanager
def serving(version: str, hidden: int) -> Iterator[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMPROF_OTEL_", "OTEL_"))}
    env["OTEL_RESOURCE_ATTRIBUTES"] = f"service.version={version},deployment.environment.name=test"
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(hidden)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline().strip() if ready else ""
        if not line.startswith("http://"):
            proc.kill()
            pytest.fail(f"the server did not start: {line!r}\n{proc.stderr.read()}")
        yield line.removeprefix("http://").rstrip("/")
    finally:
        proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def panel_expr() -> str:
    board = json.loads((Path(REPO) / "grafana" / "dashboards" / "memprof-layers.json").read_text())
    [panel] = [p for p in board["panels"] if p.get("title") == PANEL]
    [t] = panel["targets"]
    return substitute_variables(t["expr"], {**VARIABLE_VALUES, "model": "net"})


def test_the_panel_splits_each_layer_by_service_version(tmp_path: Path) -> None:
    with serving("1.0.0", HIDDEN) as old, serving("1.1.0", WIDER) as new:
        with running_prometheus([old, new], tmp_path) as prom:
            info = prom.query_until('count(memprof_build_info{service_version=~"1.0.0|1.1.0"}) == 2', timeout=60,
                                    what="both versions' build_info")
            assert info
            expr = panel_expr()
            rows = prom.query_until(f'count({expr}) >= 20', timeout=60, what="both versions' layers")
            assert rows
            by = {(r["metric"]["service_version"], r["metric"]["layer"]): float(r["value"][1])
                  for r in prom.query(expr)}
    # the wider block's Linear: B x (HIDDEN + 10) floats against B x HIDDEN, on its own line per version
    assert by[("1.1.0", "blocks.1.up")] - by[("1.0.0", "blocks.1.up")] == BATCH * (WIDER - HIDDEN) * F32
    # a layer the deploy did not touch has the same figure on both lines
    assert by[("1.1.0", "blocks.0.up")] == by[("1.0.0", "blocks.0.up")] == BATCH * HIDDEN * F32
