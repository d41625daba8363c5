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


def add_storages(tensors: Iterable[Any], into: StorageMap) -> None:
    """Each tensor's storage into ``into``; meta, fake and other storage-less tensors are skipped."""
    for t in tensors:
        try:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr:
                into[(device_label(st.device), ptr)] = int(st.nbytes())
        except Exception:  # noqa: BLE001 - a tensor subclass without a real storage holds no memory of its own
            continue


def weights(model: nn.Module) -> StorageMap:
    out: StorageMap = {}
    add_storages(model.parameters(), out)
    add_storages(model.buffers(), out)
    return out


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


__all__ = ["CACHE_KWARGS", "StorageMap", "add_storages", "cache_argument", "cache_tensors", "device_label",
           "remember", "weights"]
