"""The capacity model's table on the kinds of call servers run, against the kernel's OOM killer, on
the shipped defaults: a GPT-2 served only through ``generate()`` (the table is about its prompts,
the logits it really computes) and a ViT on pixels. Each child (``oom_cgroup_models_child.py``) runs
in a fresh v1 memory cgroup of 900 MiB until the table names a safe batch, runs it, asks again three
times and runs each answer (a server's gate, its traffic at the batch called safe), then runs 1.25x,
1.3x, 1.5x, 2x, 4x and 8x the latest answer until the kernel kills it.

The references are the kernel's: the child's exit status (SIGKILL) at the batch it was running,
and the cgroup's own ``oom_kill`` counter. Every batch called safe must survive, an answer must
come within two minutes, a batch far past the limit must not be called fitting, and the kernel
must kill by 1.25x the latest answer for the ViT, 1.3x for the GPT-2 (the answer is safe and not
timid). Under the limit the defaults fix glibc's mmap threshold at 1/128 of it (7 MiB here:
``capacity.mmap_threshold: auto``), so a large forward's blocks are mapped fresh and its resident
rise follows its tensors; with glibc's own policy (``off``) the kill came at 2x-6x the answer. The
budget's in-use figure leaves out the page cache the kernel reclaims before it kills
(``memory_budget.cgroup_in_use``). The GPT-2's answers carry the largest excess over their tensors
seen (17-36 MiB: one prompt shape's first run) and the error of an answer nearly four times past
the batches seen, on top of the margin: at its answers of 59-66 prompts that is 1.24x-1.29x short
of the kill in the runs in docs/capacity.md."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memprof_otel.sources.mmap_threshold import MALLOC_ENVIRONMENT
from tests import cgroup_truth

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
CHILD = (Path(__file__).parent / "support" / "oom_cgroup_models_child.py")
LIMIT = 900 << 20
# the kill by this many times the latest answer: the GPT-2's answers carry the excess of one prompt
# shape's first run over its tensors and the error of an answer far past the batches seen, some five
# prompts more than the ViT's (docs/capacity.md: its kill came at 1.24x-1.29x)
BOUND = {"gpt2": 1.3, "vit": 1.25}


@pytest.mark.parametrize("kind", ["gpt2", "vit"])
def test_the_table_on_the_defaults_is_safe_under_the_kernel_for_generate_and_pixels(kind: str) -> None:
    cg = cgroup_truth.make_v1_memory_cgroup(f"memprof-oom-{kind}", LIMIT)
    if cg is None:
        pytest.skip("no writable v1 memory cgroup here (root and /sys/fs/cgroup/memory are needed)")
    # the shipped defaults: no memprof-otel setting, and no malloc setting of the shell's own
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MEMPROF_OTEL_") and k not in MALLOC_ENVIRONMENT}
    env.update(OTEL_SDK_DISABLED="true", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    try:
        before = cgroup_truth.v1_oom_kills(cg)
        # GIVEN a child in the cgroup: it joins it before it imports anything
        proc = subprocess.run(["sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && exec "{sys.executable}" "{CHILD}" {kind}'],
                              capture_output=True, text=True, timeout=400, env=env)
        kills = cgroup_truth.v1_oom_kills(cg) - before
    finally:
        cgroup_truth.remove_dir(cg)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    # how the child ended, for every message below: a batch called safe that did not survive must
    # say whether the kernel killed it (the records carry what each answer rested on)
    ended = f"exit {proc.returncode}, {kills} OOM kill(s), stderr: {proc.stderr[-1500:]}"
    asked = next((r for r in records if r["phase"] == "asked"), None)
    assert asked is not None, ended
    # THEN an answer came within two minutes, and a batch far past the limit is not called fitting
    assert asked["safe"], asked
    assert asked["learnt_s"] < 120 and asked["fits_far"] is False, asked
    assert asked["heap"] == {"mmap_threshold_bytes": (LIMIT // 128) & ~4095, "set_by": "memprof-otel",
                             "reason": None}, asked["heap"]
    if kind == "gpt2":  # the table is about what generate() computes: its prompts' last logits
        assert asked["table_call"]["kind"] == "generate", asked["table_call"]
    ran = [r["batch"] for r in records if r["phase"] == "ran"]
    tried = [r["batch"] for r in records if r["phase"] == "trying"]
    answers = [asked["safe"]] + [r["safe"] for r in records if r["phase"] == "again"]
    safe = answers[-1]
    # AND every batch an answer called safe survived (the first, then each asked again after the
    # traffic, as a gate asks); the kernel's OOM killer ended the child by BOUND x the latest
    assert all(answers) and [r["batch"] for r in records if r.get("called_safe")] == answers, (records, ended)
    assert proc.returncode == -signal.SIGKILL and kills >= 1, (records, ended)
    assert safe < tried[-1] <= BOUND[kind] * safe and tried[-1] not in ran, records
    print(f"{kind}: safe {answers}, killed at {tried[-1]} ({tried[-1] / safe:.2f}x), answer after {asked['learnt_s']} s")
