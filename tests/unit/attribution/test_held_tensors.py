"""What a torch model holds, by storage: weights each once (tied ones too), a parameter set later seen
at the next read, a submodule added later within the refresh, and the tensors of a KV cache (a
``DynamicCache``, a legacy tuple) only while the cache lives."""
from __future__ import annotations

import gc

import torch
from torch import nn

from memprof_otel.attribution.torch import held


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.head = nn.Linear(16, 100, bias=False)
        self.head.weight = self.emb.weight  # one storage, two parameters
        self.register_buffer("scale", torch.ones(16))
        self.register_buffer("nothing", None)


def test_weights_count_each_storage_once_as_the_full_walk_does():
    m = Tied()
    w = held.WeightWalker()
    got = w(m)
    assert got == held.weights(m)
    assert sum(got.values()) == (100 * 16 + 16) * 4  # the embedding once, and the buffer
    assert {dev for dev, _ in got} == {"cpu"}


def test_a_parameter_set_later_counts_at_once_a_new_submodule_after_the_refresh():
    now = [0.0]
    w = held.WeightWalker(refresh_s=10.0, clock=lambda: now[0])
    m = Tied()
    base = sum(w(m).values())
    m.extra = nn.Parameter(torch.zeros(1000))             # on a module already walked
    assert sum(w(m).values()) == base + 4000
    m.emb.sub = nn.Linear(10, 10)                         # a new module: seen after the refresh
    assert sum(w(m).values()) == base + 4000
    now[0] = 10.0
    assert sum(w(m).values()) == base + 4000 + (100 + 10) * 4


class FakeLayer:
    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.keys, self.values = k, v


class FakeCache:
    """Shaped as transformers' DynamicCache: layers with keys and values, and scalars besides."""

    def __init__(self, n: int) -> None:
        self.layers = [FakeLayer(torch.zeros(2, 4, 8, 16), torch.zeros(2, 4, 8, 16)) for _ in range(n)]
        self.offloading = False
        self.model = nn.Linear(1000, 1000)  # never walked into: a module is no cache


def test_cache_tensors_are_found_in_objects_and_tuples_and_held_weakly():
    c = FakeCache(3)
    assert len(held.cache_tensors(c)) == 6
    tensors = held.remember(c)
    stor: held.StorageMap = {}
    held.add_storages(tensors(), stor)
    assert sum(stor.values()) == 6 * 2 * 4 * 8 * 16 * 4
    del c
    gc.collect()
    assert tensors() == []  # the cache is gone: nothing is counted, nothing was kept alive
    legacy = tuple((torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)) for _ in range(2))
    tensors = held.remember(legacy)
    assert len(tensors()) == 4
    del legacy
    gc.collect()
    assert tensors() == []


def test_the_cache_argument_is_read_under_the_names_the_memory_model_reads():
    c = FakeCache(1)
    assert held.cache_argument({"past_key_values": c}) is c
    assert held.cache_argument({"cache": c, "x": 1}) is c
    assert held.cache_argument({"input_ids": torch.zeros(1)}) is None
