"""Several models instrumented and none named: a missing parameter (HTTP 400 naming it, the CLI's
own --model in its message, exit 2), not an unknown model (404)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from torch import nn

import memprof_otel as mp
from tests.integration.support.demo_process import REPO

from .support.helpers import error_detail


@pytest.fixture
def two(server):
    mp.instrument(nn.Linear(4, 4), name="a")
    mp.instrument(nn.Linear(4, 4), name="b")
    return server


def test_the_route_answers_400_naming_model(client, two):
    detail = error_detail(client.post("/v1/dumps"), 400, "bad_parameter")
    assert "several models are instrumented (a, b)" in detail and "model=NAME" in detail
    assert "nope" in error_detail(client.post("/v1/dumps", params={"model": "nope"}), 404, "unknown_model")


def test_the_python_api_raises_a_typed_error_that_is_still_an_unknown_model(two):
    from memprof_otel.runtime import runtime

    with pytest.raises(mp.ModelRequired, match="several models") as e:
        runtime().dump_service.pick_model(None)
    assert isinstance(e.value, mp.UnknownModel)


def test_the_cli_names_its_own_option(two, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    proc = subprocess.run([sys.executable, "-m", "memprof_otel.cli", "dump", "--url", two.url, "-o",
                           str(tmp_path / "x.json")], capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert "HTTP 400" in proc.stderr and "pass --model NAME" in proc.stderr and "model=NAME" not in proc.stderr
