"""A child process for the memory breakdown tests: a real GPT-2 (random weights, from a config) under
memprof-otel, and known allocations in each CPU component. Prints one JSON document on stdout.

    python -m tests.integration.support.breakdown_child generate|known

The sampler runs with a long interval so that only the ticks taken here, after each step, refresh
the breakdown (a tick reads every source afresh). glibc's mmap threshold is fixed at its default
(128 KiB) so a large tensor is always an mmapped chunk, as on a fresh process, whatever the earlier
frees raised the dynamic threshold to.
"""
from __future__ import annotations

import ctypes
import gc
import json
import mmap
import os
import sys
import tempfile
import time
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

import memprof_otel as mp
from memprof_otel.runtime import runtime
from memprof_otel.sources import registry

MIB = 1 << 20
M_MMAP_THRESHOLD = -3
LIBC = ctypes.CDLL(None)
LIBC.malloc.restype = ctypes.c_void_p
LIBC.malloc.argtypes = [ctypes.c_size_t]
LIBC.free.argtypes = [ctypes.c_void_p]
LIBC.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
LIBC.memset.restype = ctypes.c_void_p


def breakdown() -> dict[str, Any]:
    """A fresh tick's CPU breakdown (waits out the glibc and Python-heap sources' back-off first)."""
    gc.collect()
    time.sleep(1.1)
    rt = runtime()
    assert rt.sampler is not None
    # glibc's figures back off by their cost (up to seconds after a slow read): a test compares two
    # moments, so it takes a real read now, which the tick's own read then returns
    host = registry.host_allocator()
    assert host is not None
    host.read(force=True)
    rt.sampler.tick()
    doc = rt.memory.document()
    return doc["devices"]["cpu"]


def build() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=512, n_head=8)).eval()


def generate(model: GPT2LMHeadModel, batch: int, new_tokens: int = 16) -> None:
    prompt = torch.randint(0, model.config.vocab_size, (batch, 32), generator=torch.Generator().manual_seed(batch))
    with torch.inference_mode():
        model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=model.config.eos_token_id)


def scenario_generate() -> dict[str, Any]:
    model = build()
    mp.instrument(model, name="gpt2")
    out: dict[str, Any] = {"after_load": breakdown(), "generate": []}
    for batch in (1, 4, 8, 4):
        generate(model, batch)
        out["generate"].append(breakdown())
    # a KV cache kept alive: its size in plain arithmetic (keys and values, per layer)
    cfg = model.config
    batch, tokens = 4, 48
    cache = DynamicCache()
    ids = torch.randint(0, cfg.vocab_size, (batch, tokens), generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    out["kv_expected_bytes"] = 2 * cfg.n_layer * batch * tokens * cfg.n_embd * 4
    out["with_cache"] = breakdown()
    del cache
    out["cache_dropped"] = breakdown()
    out["weights_expected_bytes"] = sum(p.numel() * p.element_size() for p in
                                        {p.untyped_storage().data_ptr(): p for p in model.parameters()}.values())
    out["weights_expected_bytes"] += sum(b.numel() * b.element_size() for b in model.buffers())
    return out


def _touch_file(path: str, size: int) -> mmap.mmap:
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    for off in range(0, size, mmap.PAGESIZE):
        m[off]  # read a byte of every page: resident, file-backed
    return m


def _glibc_buffer(total: int, chunk: int) -> list[int]:
    ptrs = []
    for _ in range(total // chunk):
        p = LIBC.malloc(chunk)
        LIBC.memset(p, 1, chunk)  # written: resident
        ptrs.append(p)
    return ptrs


def scenario_known() -> dict[str, Any]:
    LIBC.mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    model = build()
    mp.instrument(model, name="gpt2")
    generate(model, 2, 4)
    # warm-up of every kind of allocation below, so the code paths they run are paged in already
    tmp = tempfile.mkdtemp()
    warm = [nn.Parameter(torch.ones(1024)), torch.ones(1 << 16), _touch_file(os.path.join(tmp, "w"), 1 << 16)]
    for p in _glibc_buffer(1 << 16, 1024):
        LIBC.free(p)
    del warm
    out: dict[str, Any] = {"size": 16 * MIB, "glibc_size": 8 * MIB, "steps": {}}
    before = breakdown()
    model.extra = nn.Parameter(torch.ones(4 * MIB))              # 16 MiB of float32: a weight
    out["steps"]["parameter"] = (before, after := breakdown())
    held = torch.ones(4 * MIB)                                    # 16 MiB held outside the model
    out["steps"]["tensor"] = (after, after2 := breakdown())
    ptrs = _glibc_buffer(8 * MIB, 1024)                           # 8 MiB in 1 KiB chunks: the arenas
    out["steps"]["glibc"] = (after2, after3 := breakdown())
    mapped = _touch_file(os.path.join(tmp, "f"), 16 * MIB)       # 16 MiB mapped and read
    out["steps"]["file"] = (after3, breakdown())
    del held, ptrs, mapped
    return out


def main() -> None:
    mp.start_monitoring({"sampler": {"interval": "1h"}})
    which = sys.argv[1]
    doc = scenario_generate() if which == "generate" else scenario_known()
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
