"""The processes of the back-to-back post-mortem cause test.

    python -m tests.integration.support.cause_child victim CGROUP_DIR
    python -m tests.integration.support.cause_child reader

``victim``: joins ``CGROUP_DIR`` (its ``cgroup.procs``) before importing torch, instruments a real
model (a Hugging Face ``BertModel`` from a config, eager attention: the b x h x s x s scores are
materialised) with the shipped defaults (plain ``mp.instrument(model)``), and runs forwards of
mixed shapes back to back (no sleep between them) for ``TRAFFIC_S``. Then, between two forwards,
it reads the budget the way ``GET /v1/headroom`` does (the handle's ``headroom()``, the same
document as the endpoint's entry for the model) and prints it as one JSON line ``{"phase":
"budget", ...}``, with the cgroup's own files read beside it; and at once, back to back, starts a
forward of ``FATAL_SHAPE`` in which layer ``HOARD_LAYER`` keeps ``CHUNK`` tensors (every page
written) until the kernel kills the process, printing ``{"phase": "hoard", "bytes": N}`` after
each: the last line is what the kernel let the request take. Every line on stdout is JSON, flushed
(a pipe keeps what was written before the kill).

``reader``: instruments a model (which scans the black boxes left behind), serves the endpoint,
prints its URL and ends when its stdin closes.

The black box folder, the service name and the sampler interval come from ``MEMPROF_OTEL_*``.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time

TRAFFIC_S = 6.0
# mixed shapes, the larger with a transient of 100-200 MiB (scores and their softmax: 8 heads x s x s
# floats a sequence, per layer): a tick inside one of them holds it
SHAPES = ((8, 512), (2, 128), (6, 384), (1, 64), (10, 512), (4, 256), (8, 128))
FATAL_SHAPE = (2, 128)  # its own transient is small: what it hoards is nearly all its rise
HOARD_LAYER = "encoder.layer.1.intermediate"
CHUNK = 8 << 20


def say(**kw: object) -> None:
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


def _cgroup_now(cgroup: str) -> dict[str, int]:
    """The cgroup's own files and this process's resident size, read here, as a diagnostic beside the budget."""
    def read(name: str) -> str:
        with open(os.path.join(cgroup, name)) as f:
            return f.read()
    usage, stat = int(read("memory.usage_in_bytes")), read("memory.stat")
    charged = {k: int(v) for k, v in re.findall(r"^total_(inactive_file|rss|mapped_file|cache) (\d+)$", stat, re.M)}
    with open("/proc/self/status") as f:
        status = f.read()
    kb = {k: int(v) * 1024 for k, v in re.findall(r"^(VmRSS|RssAnon|RssFile|RssShmem):\s+(\d+) kB$", status, re.M)}
    return {"usage_bytes": usage, "working_set_bytes": usage - charged.get("inactive_file", 0),
            "charged_anon_bytes": charged.get("rss", 0), "charged_mapped_file_bytes": charged.get("mapped_file", 0),
            "charged_cache_bytes": charged.get("cache", 0), "rss_bytes": kb.get("VmRSS", 0),
            "rss_anon_bytes": kb.get("RssAnon", 0), "rss_file_bytes": kb.get("RssFile", 0)}


def victim(cgroup: str) -> None:
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    import torch
    import transformers

    import memprof_otel as mp

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=4, num_attention_heads=8,
                                  intermediate_size=512, max_position_embeddings=512,
                                  attn_implementation="eager")
    model = transformers.BertModel(cfg).eval()
    h = mp.instrument(model)  # the shipped defaults: no every_n_forwards, no overhead_budget
    gen = torch.Generator().manual_seed(1)
    inputs = {s: torch.randint(0, 1000, s, generator=gen) for s in SHAPES + (FATAL_SHAPE,)}
    layer = model.get_submodule(HOARD_LAYER)
    plain = layer.forward
    kept: list = []

    def hoarding(*args, **kwargs):
        while True:  # every page written (ones, not empty): charged to the cgroup at once
            kept.append(torch.ones(CHUNK // 4))
            say(phase="hoard", bytes=len(kept) * CHUNK)

    say(phase="start", pid=os.getpid())
    forwards, end = 0, time.monotonic() + TRAFFIC_S
    with torch.no_grad():
        while time.monotonic() < end:
            out = model(input_ids=inputs[SHAPES[forwards % len(SHAPES)]])
            forwards += 1
        del out
        # between two forwards: what a client asking /v1/headroom sees now
        doc = h.headroom()
        say(phase="budget", budget=doc.get("budget"), budget_reason=doc.get("budget_reason"), forwards=forwards,
            read_unix=time.time(), cgroup_now=_cgroup_now(cgroup))
        layer.forward = hoarding  # the instance's forward: the module's hooks still run around it
        model(input_ids=inputs[FATAL_SHAPE])  # back to back: killed by the kernel inside it
        layer.forward = plain
    say(phase="survived")


def reader() -> None:
    from tests.integration.support.blackbox_child import reader as serve_until_stdin_closes
    serve_until_stdin_closes()


if __name__ == "__main__":
    if sys.argv[1] == "victim":
        victim(sys.argv[2])
    else:
        reader()
