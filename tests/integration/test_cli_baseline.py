"""``memprof-otel baseline save`` and ``diff`` run as users run them (subprocesses) against a live
endpoint serving a real CPU model: the endpoint's baseline is the one measured in Python on the same
model and inputs, and the gate exits 3 on a wider block and 0 on no change."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

import memprof_otel as mp
from memprof_otel.baselines import from_layers_document, load
from tests.integration.support.baseline_models import HIDDEN, Net, inputs, measure
from tests.integration.support.demo_process import REPO

pytestmark = pytest.mark.timeout(180)

TOKEN = "b4seline-token"
FORWARDS = 3


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    return subprocess.run([sys.executable, "-m", "memprof_otel.cli", *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=REPO)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Net]]:
    mp.start_monitoring({"sampler": {"interval": "100ms"}, "dumps": {"dir": str(tmp_path / "dumps")}})
    torch.manual_seed(0)
    model = Net()
    h = mp.instrument(model, name="served", every_n_forwards=1, overhead_budget=1.0)
    with torch.inference_mode():
        for _ in range(FORWARDS):  # the same shapes every time, as a load test would send
            model(inputs())
    srv = mp.serve(port=0, token=TOKEN)
    yield srv.url, model
    srv.close()
    h.uninstrument()


def test_the_endpoints_baseline_is_the_one_measured_in_python(served, tmp_path: Path) -> None:
    url, _ = served
    out = tmp_path / "served.json"
    # WHEN the CLI saves the endpoint's baseline
    proc = cli("baseline", "save", "--url", url, "--token", TOKEN, "--model", "served", "-o", str(out),
               "--input", "arg0=float32[8,64]", "--since-start")
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}: model served, 14 layers, {FORWARDS} forwards" in proc.stdout
    saved = load(out)
    # THEN it is what another HTTP client reads from /v1/layers ...
    got = httpx.get(f"{url}/v1/layers", params={"model": "served"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert saved == from_layers_document(got.json(), "served", inputs={"arg0": "float32[8,64]"})
    assert saved.source == "endpoint" and saved.forwards == FORWARDS
    # ... and what the same model and inputs give in Python, layer by layer (counts per forward)
    torch.manual_seed(0)
    reference = measure(Net(), name="reference")
    assert saved.layers == reference.layers and saved.fingerprint == reference.fingerprint
    assert saved.environment == reference.environment
    ref_file = tmp_path / "reference.json"
    ref_file.write_text(reference.dumps())
    same = cli("diff", str(ref_file), str(out), "--fail-above", "0%")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "no change" in same.stdout


def test_diff_exits_3_on_a_wider_block_and_names_it(served, tmp_path: Path) -> None:
    url, _ = served
    old = tmp_path / "old.json"
    assert cli("baseline", "save", "--url", url, "--token", TOKEN, "-o", str(old), "--since-start").returncode == 0  # one model: no --model
    torch.manual_seed(0)
    new = tmp_path / "new.json"
    new.write_text(measure(Net(hidden=(HIDDEN, HIDDEN * 102 // 100, HIDDEN))).dumps())
    # a 1 % gate: the block's 2 % growth fails it, with the table in the log
    proc = cli("diff", str(old), str(new), "--fail-above", "1%")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("memprof-otel diff: FAIL:")
    [row] = [line for line in proc.stdout.splitlines() if line.startswith("blocks.1 ") and "peak increase" in line]
    assert row.rstrip().endswith("FAIL") and ("+1." in row or "+2." in row)
    assert "blocks.0" not in proc.stdout and "head" not in proc.stdout
    # a 3 % gate, or 3 % and 1 MiB: exit 0
    assert cli("diff", str(old), str(new), "--fail-above", "3%").returncode == 0
    assert cli("diff", str(old), str(new), "--fail-above", "1%", "--fail-above-bytes", "1MiB").returncode == 0
    # --json and --markdown say the same
    doc = json.loads(cli("diff", str(old), str(new), "--fail-above", "1%", "--json").stdout)
    assert doc["failed"] is True and "blocks.1" in {c["layer"] for c in doc["changes"] if c["exceeds"]}
    md = cli("diff", str(old), str(new), "--fail-above", "1%", "--markdown").stdout
    assert md.startswith("### :x: memprof-otel diff: FAIL") and "| `blocks.1` | peak increase |" in md


@pytest.mark.parametrize("args,code,fragment", [
    (["baseline", "save", "--model", "nope"], 2, "HTTP 404: unknown_model"),
    (["baseline", "save", "--input", "batch"], 2, "expected NAME=VALUE"),
    (["diff", "missing-old.json", "missing-new.json"], 2, "missing-old.json: cannot read the baseline"),
    (["diff", "{old}", "{old}", "--fail-above", "two"], 2, "write it as a percentage"),
    (["diff", "{old}", "{old}", "--fail-above", "0.02"], 2, "a bare number is refused"),
    (["diff", "{old}", "{old}", "--fail-above=-1%"], 2, "expected a percentage >= 0"),
    (["diff", "{old}", "{old}", "--fail-above-bytes", "lots"], 2, "--fail-above-bytes"),
    (["diff", "{bad}", "{old}"], 2, "not a memprof-otel baseline"),
])
def test_errors_are_one_line_with_the_usual_exit_codes(served, tmp_path: Path, args, code, fragment) -> None:
    url, _ = served
    old, bad = tmp_path / "old.json", tmp_path / "bad.json"
    bad.write_text('{"schema": "other"}')
    if args[0] == "baseline":
        args = [*args, "--url", url, "--token", TOKEN, "-o", str(old)]
    else:
        assert cli("baseline", "save", "--url", url, "--token", TOKEN, "-o", str(old), "--since-start").returncode == 0
    proc = cli(*[a.format(old=old, bad=bad) for a in args])
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert fragment in proc.stderr and "Traceback" not in proc.stderr
