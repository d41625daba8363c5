"""Baselines of real models on the CPU tensor ledger: no false positives across fresh processes, and
the changes a gate must catch (a wider intermediate, a kept activation, a rename, another attention
kernel) caught and named, with the figures checked against plain arithmetic."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import memprof_otel as mp
from memprof_otel.baselines import Thresholds, diff, loads
from memprof_otel.baselines.render import text
from tests.integration.support.baseline_models import BATCH, F32, HIDDEN, Net, measure
from tests.integration.support.demo_process import REPO

pytestmark = pytest.mark.timeout(300)

RUNS = 20


def _child(*argv: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    proc = subprocess.run([sys.executable, "-m", "tests.integration.support.baseline_models", *argv], capture_output=True,
                          text=True, timeout=240, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_twenty_fresh_processes_give_the_same_baseline_to_the_byte() -> None:
    # GIVEN the same model and inputs measured in 20 processes forked from one that has only imported
    # torch (importing torch and its compiler costs seconds; forking skips that), and in two fresh
    # interpreters besides (nothing shared at all)
    with ThreadPoolExecutor(3) as pool:
        forked = pool.submit(_child, str(RUNS))
        fresh = [pool.submit(_child) for _ in range(2)]
        outputs = json.loads(forked.result()) + [f.result() for f in fresh]
    assert len(outputs) == RUNS + 2
    # THEN every file is the same, byte for byte; so every diff is empty and no threshold can fail
    assert len(set(outputs)) == 1, text(diff(loads(outputs[0]), loads(next(o for o in outputs if o != outputs[0]))))
    first = loads(outputs[0])
    assert len(first.layers) == 1 + 3 * 4 + 1  # root, 3 blocks of 3, the head (a ModuleList is never called)
    # AND the figures are the model's: the head's output, B x 10 floats, is what it allocates and returns
    head = first.layer("head")
    assert head.peak_increase_bytes == head.retained_bytes == BATCH * 10 * F32


def test_a_two_percent_wider_intermediate_in_one_block_is_caught_and_named() -> None:
    torch.manual_seed(0)
    old = measure(Net())
    wider = HIDDEN * 102 // 100  # 250 -> 255
    torch.manual_seed(0)
    new = measure(Net(hidden=(HIDDEN, wider, HIDDEN)))
    d = diff(old, new, Thresholds(fail_above=0.01))
    # the Linear's output is B x hidden floats: its peak grows by exactly B x 5 floats
    up = next(c for c in d.changes if c.layer == "blocks.1.up" and c.figure == "peak_increase_bytes")
    assert up.delta == BATCH * (wider - HIDDEN) * F32
    block = next(c for c in d.changes if c.layer == "blocks.1" and c.figure == "peak_increase_bytes")
    assert 0.015 <= block.relative <= 0.025, block  # a 2 % change of the block's transient peak
    assert block in d.failures
    # only block 1, what is inside it and what contains it changed; the other blocks and the head did not
    changed = {c.layer for c in d.changes}
    assert changed <= {"", "blocks", "blocks.1", "blocks.1.up", "blocks.1.act", "blocks.1.down"}, changed
    assert "blocks.1" in text(d) and "blocks.0" not in text(d) and "head" not in text(d)
    # a 3 % gate lets it through
    assert not diff(old, new, Thresholds(fail_above=0.03)).failures


def test_a_kept_activation_is_caught_as_retained_bytes() -> None:
    torch.manual_seed(0)
    old = measure(Net())
    torch.manual_seed(0)
    new = measure(Net(cache=(False, False, True)))
    d = diff(old, new, Thresholds(fail_above=0.02))
    ret = next(c for c in d.failures if c.layer == "blocks.2")
    assert ret.figure == "retained_bytes" and ret.delta == BATCH * HIDDEN * F32  # the kept B x hidden floats
    assert not any(c.figure == "peak_increase_bytes" and c.layer == "blocks.2" for c in d.changes)


def test_a_renamed_module_list_is_matched_not_removed_and_added() -> None:
    torch.manual_seed(0)
    old = measure(Net())
    torch.manual_seed(0)
    new = measure(Net(blocks_name="layers"))
    d = diff(old, new, Thresholds(fail_above=0.0))
    assert not d.added and not d.removed
    # every layer with figures under the list (the list itself is never called: no figures of its own)
    assert d.renamed == tuple((f"blocks.{i}{leaf}", f"layers.{i}{leaf}")
                              for i in range(3) for leaf in ("", ".up", ".act", ".down"))
    assert not d.changes and not d.failures and d.structure_changed


def _gpt2(impl: str) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=256, n_embd=64, n_layer=2, n_head=4, bos_token_id=1,
                                  eos_token_id=2, pad_token_id=0, attn_implementation=impl)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _gpt2_baseline(impl: str):
    model = _gpt2(impl)  # held here: a handle keeps only a weak reference to its model
    h = mp.instrument(model, name="gpt2")
    try:
        with torch.inference_mode():
            return h.baseline(torch.randint(0, 256, (2, 128), generator=torch.Generator().manual_seed(0)))
    finally:
        h.uninstrument()


def test_gpt2_eager_vs_sdpa_names_the_attention_layers_and_nothing_else() -> None:
    sdpa, eager = _gpt2_baseline("sdpa"), _gpt2_baseline("eager")
    assert _gpt2_baseline("sdpa") == sdpa  # the same kernel again: the same baseline
    d = diff(sdpa, eager, Thresholds(fail_above=0.02))
    assert d.environment == {"attention": ("sdpa", "eager")}
    assert not d.added and not d.removed and not d.renamed and not d.structure_changed
    attention = {"transformer.h.0.attn", "transformer.h.1.attn"}
    # the attention layers changed (eager materialises the B x heads x T x T scores and their softmax) ...
    grown = {c.layer for c in d.failures if c.figure == "peak_increase_bytes"}
    assert attention <= grown
    for c in d.changes:
        if c.layer in attention and c.figure == "peak_increase_bytes":
            assert c.delta >= 2 * 4 * 128 * 128 * F32  # at least one B x heads x T x T float32 matrix more
    # ... and every other layer that changed contains one of them
    for c in d.changes:
        assert c.layer in attention or any(a.startswith(c.layer + ".") or not c.layer for a in attention), c
