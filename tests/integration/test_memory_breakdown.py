"""The memory breakdown on real models, in child processes: its parts sum to the kernel's RSS with
little unexplained (a GPT-2 generate loop; the demo's is checked in ``test_demo.py``), and a known allocation in each component moves
that component by its size and nothing else.

Tolerances, and why:
- the parts and ``unexplained`` sum to the total exactly (the document's arithmetic);
- unexplained within 5 % of RSS: the goal the breakdown is built for (thread stacks, libraries' own
  mappings and written data pages are the few percent it leaves);
- a known allocation of 16 MiB (8 MiB for the glibc buffer) moves its component by its size within
  1 MiB: page rounding, a tensor's few hundred bytes of header objects, glibc's 16-byte chunk headers
  (8192 chunks: 128 KiB) and the objects a tick itself creates;
- other components move by at most 2 MiB: the Python objects and malloc'd bookkeeping the step and
  the tick create, and library code paged in on first use (the steps are warmed up first).
A glibc buffer may reuse free chunks glibc kept: then ``heap_free`` pays for it and RSS grows by
less. So for that step ``heap_free`` is not held still; instead the explained total must follow RSS
(unexplained still within 2 MiB).
"""
from __future__ import annotations

import json
import statistics
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.support.breakdown_sums import MIB, TICK_BOUND, UNEXPLAINED_GOAL, check_sums

REPO = Path(__file__).resolve().parents[2]
SIZE_TOLERANCE = 1 * MIB
OTHERS_TOLERANCE = 2 * MIB


def run_child(which: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "tests.integration.support.breakdown_child", which], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def generate_run() -> dict[str, Any]:
    return run_child("generate")


@pytest.fixture(scope="module")
def known_run() -> dict[str, Any]:
    return run_child("known")


def test_gpt2_generate_loop_leaves_at_most_five_percent_unexplained(generate_run: dict[str, Any]):
    docs = [generate_run["after_load"], *generate_run["generate"], generate_run["with_cache"]]
    ratios = [check_sums(d) for d in docs]
    print("unexplained / RSS over the generate loop:", [f"{r:+.2%}" for r in ratios],
          "RSS MiB:", [d["total_bytes"] // MIB for d in docs])
    # the goal holds for the demo as a whole (the median tick); a single tick has reached +5.58 % (about
    # one in ten: the Python heap's figure is up to 5 s old while traffic moves it), so the ticks are
    # held to a looser bound that still fails a missing component (MiniLM's weights are ~20 % of RSS,
    # missing from every tick). On a loaded machine the components of one tick are read further apart:
    # one tick in five reached -16.6 % and +9.6 % there, the others within 2 % (the same before and
    # after the sources' back-off was shared), so one tick of the five may stray past it
    assert statistics.median(abs(r) for r in ratios) <= UNEXPLAINED_GOAL, ratios
    assert sum(abs(r) > TICK_BOUND for r in ratios) <= 1, ratios
    for d in docs:
        assert d["components"]["python_heap"] > 0 and d["components"]["file_backed"] > 0
        assert d["components"]["heap_in_use"] > 0


def test_weights_are_the_models_parameters_each_storage_once(generate_run: dict[str, Any]):
    # GPT-2 ties lm_head to the token embedding: counted once (numel * element size, by storage)
    assert generate_run["after_load"]["components"]["weights"] == generate_run["weights_expected_bytes"]


def test_a_kv_cache_the_model_is_called_with_counts_while_it_lives(generate_run: dict[str, Any]):
    assert generate_run["with_cache"]["components"]["kv_cache"] == generate_run["kv_expected_bytes"]
    assert generate_run["cache_dropped"]["components"]["kv_cache"] == 0
    # between generate() calls (their caches dropped) nothing is counted as a cache
    assert all(d["components"]["kv_cache"] == 0 for d in generate_run["generate"])


def _deltas(step: list[dict[str, Any]]) -> dict[str, int]:
    before, after = step
    out = {k: after["components"][k] - before["components"][k] for k in after["components"]}
    out["unexplained"] = after["unexplained_bytes"] - before["unexplained_bytes"]
    out["total"] = after["total_bytes"] - before["total_bytes"]
    return out


@pytest.mark.parametrize("step, component", [("parameter", "weights"), ("tensor", "heap_in_use"),
                                             ("glibc", "heap_in_use"), ("file", "file_backed")])
def test_a_known_allocation_moves_its_component_by_its_size_and_no_other(known_run: dict[str, Any], step: str,
                                                                         component: str):
    size = known_run["glibc_size"] if step == "glibc" else known_run["size"]
    for doc in known_run["steps"][step]:
        check_sums(doc)
    d = _deltas(known_run["steps"][step])
    print(step, {k: f"{v / MIB:+.2f} MiB" for k, v in d.items()})
    assert abs(d[component] - size) <= SIZE_TOLERANCE, d
    held_still = {"weights", "kv_cache", "heap_in_use", "python_heap", "file_backed", "shared_memory",
                  "heap_free", "unexplained"} - {component}
    if step == "glibc":
        held_still.discard("heap_free")  # reused free chunks: heap_free pays, RSS grows by less
        assert abs(d["total"] - (d[component] + d["heap_free"])) <= OTHERS_TOLERANCE, d
    for other in sorted(held_still):
        assert abs(d[other]) <= OTHERS_TOLERANCE, (other, d)

