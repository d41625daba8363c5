"""What a baseline records about a model besides its figures, read off the model's own objects (duck
typing: this module imports no framework): each layer's structural signature and the facts of the
environment its figures depend on."""
from __future__ import annotations

import platform
import sys
from collections.abc import Iterable
from typing import Any

from .._version import __version__


def tensor_text(t: Any) -> str:
    """``float32[4,8]``: a tensor's dtype and shape (anything with ``dtype`` and ``shape``)."""
    dtype = str(getattr(t, "dtype", "?")).rpartition(".")[2]  # torch.float32 -> float32
    return f"{dtype}[{','.join(str(int(d)) for d in tuple(getattr(t, 'shape', ())))}]"


def describe_input(value: Any) -> str:
    """An input as a baseline names it: a tensor's ``dtype[shape]``, a scalar's value, else its type."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return tensor_text(value)
    if isinstance(value, (bool, int, float, str)) or value is None:
        return repr(value)
    return type(value).__qualname__


def signature(layer: Any) -> str:
    """``Linear(weight=float32[64,16],bias=float32[64])``: the layer's type and its *own* parameters
    and buffers (a torch module's, not its children's: they have their own). A layer of another
    framework (Keras) is known by its type alone. Never raises: a layer that cannot be read is "?"."""
    name = type(layer).__qualname__
    try:
        own: list[tuple[str, Any]] = []
        for attr in ("named_parameters", "named_buffers"):
            fn = getattr(layer, attr, None)
            if callable(fn):
                own += list(fn(recurse=False))
    except Exception:  # a module whose named_parameters fails: still a layer, known by its type
        return f"{name}(?)"
    return f"{name}({','.join(f'{n}={tensor_text(t)}' for n, t in own)})"


def signatures(layers: Iterable[tuple[str, Any]], tracked: Iterable[str] | None = None) -> dict[str, str]:
    """Path -> signature, in the model's order; with ``tracked``, only those paths (the layers with
    figures: max_depth and include/exclude leave the others out)."""
    keep = set(tracked) if tracked is not None else None
    return {p: signature(obj) for p, obj in layers if keep is None or p in keep}


def attention_implementation(model: Any) -> str | None:
    """A transformers model's attention kernel (``eager``, ``sdpa``, ``flash_attention_2``), read from
    its config; None for other models."""
    value = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return value if isinstance(value, str) else None


def framework_versions(model: Any, device: str) -> dict[str, str | None]:
    """The versions that move figures: the framework the model belongs to (already imported: it is
    running), and CUDA's where the figures come from a CUDA device."""
    root = type(model).__module__.partition(".")[0]
    out: dict[str, str | None] = {}
    torch = sys.modules.get("torch")
    if torch is not None and root != "keras":
        out["torch"] = str(getattr(torch, "__version__", "")) or None
        if device.startswith("cuda"):
            out["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    for name in ("keras", "tensorflow", "jax"):
        mod = sys.modules.get(name)
        if mod is not None and (root == "keras" or root == name):
            out[name] = str(getattr(mod, "__version__", "")) or None
    return out


def environment(model: Any, device: str) -> dict[str, str | None]:
    """The facts a baseline is valid for: a diff lists those that differ."""
    return {"device": device, **framework_versions(model, device),
            "attention": attention_implementation(model),
            "python": ".".join(platform.python_version_tuple()[:2]), "memprof_otel": __version__}
