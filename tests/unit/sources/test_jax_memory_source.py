"""The JAX counter's arithmetic, on a stand-in ``jax`` module (JAX is not in this environment; the
real one is exercised by tests/integration/test_keras_jax_backend.py on CPU). The GPU path cannot
run here: its per-window peak, derived from an all-time high JAX never resets, is checked on
device statistics written below."""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import pytest


class _Device:
    def __init__(self, platform: str, id: int, stats: dict[str, int] | None) -> None:
        self.platform, self.id, self.stats = platform, id, stats

    def memory_stats(self) -> dict[str, int] | None:
        return None if self.stats is None else dict(self.stats)


class _Array:
    def __init__(self, nbytes: int, devices: list[_Device], shards: list[tuple[_Device, int]] = (),
                 deleted: bool = False) -> None:
        self.nbytes, self._devices, self._deleted = nbytes, devices, deleted
        self.aval, self.sharding = object(), object()  # what the counter's memo checks by identity
        self.addressable_shards = [types.SimpleNamespace(device=d, data=types.SimpleNamespace(nbytes=n))
                                   for d, n in shards]

    def devices(self) -> set[_Device]:
        if self._deleted:
            raise RuntimeError("Array has been deleted")
        return set(self._devices)


@pytest.fixture
def jm(monkeypatch: pytest.MonkeyPatch) -> Any:
    """memprof_otel.sources.jax_memory imported over a stand-in ``jax`` whose live arrays and
    devices the test sets."""
    fake = types.ModuleType("jax")
    fake.arrays = []  # type: ignore[attr-defined]
    fake.live_arrays = lambda: list(fake.arrays)  # type: ignore[attr-defined]
    fake.devices = lambda: [_Device("cpu", 0, None)]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jax", fake)
    monkeypatch.delitem(sys.modules, "memprof_otel.sources.jax_memory", raising=False)
    module = importlib.import_module("memprof_otel.sources.jax_memory")
    module.fake = fake
    yield module
    sys.modules.pop("memprof_otel.sources.jax_memory", None)  # not kept bound to the stand-in


def test_on_cpu_the_level_is_the_live_arrays_on_that_device_and_the_peak_the_higher_end(jm: Any) -> None:
    cpu, other = _Device("cpu", 0, None), _Device("cpu", 1, None)
    jm.fake.arrays = [_Array(4096, [cpu]), _Array(1000, [other])]
    c = jm.JaxMemoryCounter(cpu)
    assert c.peak_is_lower_bound and not c.allocator_stats
    # a kept array, one on another device, one sharded over both, one deleted meanwhile
    jm.fake.arrays = [_Array(4096, [cpu]), _Array(1000, [other]), _Array(4096 * 2, [cpu], deleted=True),
                      _Array(600, [cpu, other], shards=[(cpu, 200), (other, 400)]), _Array(1 << 20, [cpu])]
    r = c.read_and_reset()
    assert (r.allocated, r.reserved, r.peak) == (4096 + 200 + (1 << 20),) * 3
    assert (r.allocations, r.frees, r.fragmentation) == (0, 0, None)
    # everything but the first array gone: the window's peak is where it started, the level is back
    jm.fake.arrays = [_Array(4096, [cpu])]
    r = c.read_and_reset()
    assert (r.allocated, r.peak) == (4096, 4096 + 200 + (1 << 20))
    # reset_peak starts the window at the level now
    c.reset_peak()
    assert c.read_and_reset().peak == 4096


def test_an_array_whose_shape_or_placement_changed_under_the_same_id_is_counted_afresh(jm: Any) -> None:
    # the counter remembers each array's bytes by id while its aval and sharding are the same
    # objects; a new array that got a freed one's id has objects of its own
    cpu, other = _Device("cpu", 0, None), _Device("cpu", 1, None)
    a = _Array(4096, [cpu])
    jm.fake.arrays = [a]
    live = jm.LiveArrayBytes(cpu)
    assert live() == 4096
    a.nbytes, a.aval = 8192, object()       # the same id, another shape
    assert live() == 8192
    a._devices, a.sharding = [other], object()  # the same id, now on another device
    assert live() == 0


def test_on_a_gpu_the_window_peak_is_the_new_all_time_high_or_else_a_lower_bound(jm: Any) -> None:
    gpu = _Device("gpu", 1, {"bytes_in_use": 100, "peak_bytes_in_use": 500})
    c = jm.JaxMemoryCounter(gpu)
    assert c.allocator_stats and not c.peak_is_lower_bound
    # the level rose to 200 but stayed under the earlier high of 500: only the ends are known
    gpu.stats = {"bytes_in_use": 200, "peak_bytes_in_use": 500}
    r = c.read_and_reset()
    assert (r.allocated, r.reserved, r.peak) == (200, 200, 200)
    # a new high of 900 was reached inside this window: its peak exactly
    gpu.stats = {"bytes_in_use": 150, "peak_bytes_in_use": 900}
    assert c.read_and_reset().peak == 900
    # no new high since: the window peaks at its higher end again, not at the old 900
    gpu.stats = {"bytes_in_use": 120, "peak_bytes_in_use": 900}
    assert c.read_and_reset().peak == 150
    assert jm.jax_device_label(gpu) == "cuda:1"  # as torch labels the same GPU


def test_device_labels(jm: Any) -> None:
    assert jm.jax_device_label(_Device("cpu", 3, None)) == "cpu"
    assert jm.jax_device_label(_Device("TPU", 2, None)) == "tpu:2"
    # no device given: the default one, as Keras puts arrays there
    assert jm.JaxMemoryCounter().device.platform == "cpu"
