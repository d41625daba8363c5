"""What a torch model holds in memory, by storage: its weights and the KV cache it was last called
with (the memory breakdown's ``weights`` and ``kv_cache`` components).

Tensors are counted by their storage (``untyped_storage()``), keyed by device and data pointer, so a
storage several tensors share (tied embeddings, views, a cache layer's keys sliced from one buffer)
counts once, within a model and across models (the caller merges the maps). A storage's bytes are
its ``nbytes()``: what was asked of the allocator, before its rounding.

A KV cache is seen where the model's root forward is called with one (``past_key_values``, ``cache``
or ``past_key_value``, the names the memory model reads: Hugging Face ``Cache`` objects and legacy
tuples). The handle keeps only weak references, so a cache a ``generate()`` dropped counts 0 at the
next tick; its tensors are found by walking the object's attributes, lists, tuples and dicts (a
``DynamicCache``'s ``layers[i].keys``, an older one's ``key_cache`` lists, an encoder-decoder cache's
two caches), never into a module.
"""
from __future__ import annotations

import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Callable

import torch
from torch import nn

StorageMap = dict[tuple[str, int], int]  # (device, storage data pointer) -> bytes
CACHE_KWARGS = ("past_key_values", "cache", "past_key_value")
_MAX_DEPTH = 5
_MAX_NODES = 20_000  # a cache of 100 layers has a few hundred objects: this only bounds a pathological one


def device_label(device: torch.device) -> str:
    return device.type if device.index is None else f"{device.type}:{device.index}"


_CUDA_LABELS: dict[int, str] = {}


def _cuda_label(index: int) -> str:
    label = _CUDA_LABELS.get(index)
    if label is None:
        label = _CUDA_LABELS[index] = f"cuda:{index}"
    return label


def add_storages(tensors: Iterable[Any], into: StorageMap) -> None:
    """Each tensor's storage into ``into``; meta, fake and other storage-less tensors are skipped."""
    for t in tensors:
        if t is None:  # a registered name without a tensor (``register_buffer("b", None)``)
            continue
        try:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr:
                # ``.device`` builds a torch.device (2.5 us a tensor here): the index says it for cpu and cuda
                index = t.get_device()
                label = "cpu" if index < 0 else _cuda_label(index) if t.is_cuda else device_label(t.device)
                into[(label, ptr)] = st.nbytes()
        except Exception:  # noqa: BLE001 - a tensor subclass without a real storage holds no memory of its own
            continue


def weights(model: nn.Module) -> StorageMap:
    out: StorageMap = {}
    add_storages(model.parameters(), out)
    add_storages(model.buffers(), out)
    return out


class WeightWalker:
    """A model's weights by storage, read on every sampler tick. ``model.parameters()`` walks the
    module tree through generators (about 0.5 ms on a 6-layer GPT-2 here, twice that with buffers), so
    the list of modules is kept and walked again only every ``refresh_s``; each tick reads every kept
    module's own parameter and buffer dicts, so a parameter or buffer set on a module (``m.extra =
    nn.Parameter(...)``, ``m.to(...)``, ``p.data = ...``) counts at the next tick, a submodule added
    after that within ``refresh_s``."""

    def __init__(self, refresh_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._refresh_s = refresh_s
        self._clock = clock
        self._modules: list[nn.Module] = []
        self._walked_at: float | None = None
        self._root: Callable[[], nn.Module | None] = _no_model

    def __call__(self, model: nn.Module) -> StorageMap:
        now = self._clock()
        if self._root() is not model or self._walked_at is None or now - self._walked_at >= self._refresh_s:
            self._modules = list(model.modules())
            self._root = weakref.ref(model)
            self._walked_at = now
        out: StorageMap = {}
        for mod in self._modules:
            add_storages(mod._parameters.values(), out)
            add_storages(mod._buffers.values(), out)
        return out


def _no_model() -> None:
    return None


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """Every tensor reachable from a KV cache object (bounded walk; modules are not entered)."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(cache, 0)]
    while stack and len(seen) < _MAX_NODES:
        obj, depth = stack.pop()
        if isinstance(obj, torch.Tensor):
            found.append(obj)
            continue
        if depth >= _MAX_DEPTH or id(obj) in seen or isinstance(obj, (nn.Module, str, bytes, int, float)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            children: Iterable[Any] = obj
        elif isinstance(obj, Mapping):
            children = obj.values()
        else:
            children = getattr(obj, "__dict__", {}).values()
        stack.extend((c, depth + 1) for c in children)
    return found


def _dead() -> list[torch.Tensor]:
    return []


def cache_argument(kwargs: Mapping[str, Any]) -> Any:
    for name in CACHE_KWARGS:
        c = kwargs.get(name)
        if c is not None:
            return c
    return None


def remember(cache: Any) -> Callable[[], list[torch.Tensor]]:
    """A function giving the cache's tensors while the cache lives, holding it weakly. A legacy
    tuple takes no weak reference: its tensors are held weakly one by one instead."""
    try:
        ref = weakref.ref(cache)
    except TypeError:
        refs = [weakref.ref(t) for t in cache_tensors(cache)]
        return lambda: [t for t in (r() for r in refs) if t is not None]

    def tensors() -> list[torch.Tensor]:
        c = ref()
        return cache_tensors(c) if c is not None else []

    return tensors


__all__ = ["CACHE_KWARGS", "StorageMap", "WeightWalker", "add_storages", "cache_argument", "cache_tensors", "device_label",
           "remember", "weights"]
