"""The layer tree of a Keras 3 model as dotted paths, read from the objects alone.

Keras keeps most of its layers in its own tracking lists (a ``Sequential``'s layers, a functional
graph's operations, layers held in a Python list), not where a framework's own module walk would
find them: on the torch backend ``named_modules()`` lists only layers assigned to plain attributes.
So the tree comes from Keras: every layer's direct children are
``layer._flatten_layers(include_self=False, recursive=False)``, walked depth first. The result is the
tree ``model.summary(expand_nested=True)`` prints, and it goes on into custom layers (whose sublayers
the summary does not expand).

Nothing here imports keras (or any framework): a Keras layer is recognised by the classes its type
derives from, so asking about a torch model or a plain object costs no import, and the same tree
serves every backend Keras runs on.

Paths
-----
The root is ``""``; below it, the layers' names joined with ``"."`` like torch's module paths, so
``attribution.max_depth`` (which counts dots), the ``include``/``exclude`` globs and the exported
``layer`` label work on them unchanged. Keras allows what such a path cannot say, so three rules
make every path one layer's:

* a ``"."`` inside a Keras name becomes ``"_"`` (``Dense(name="fc.1")`` is ``fc_1``): otherwise
  ``a.b`` could be a layer ``b`` in ``a`` or a layer named ``a.b``, and depth would be miscounted;
* an empty name becomes the layer's class name;
* names are unique among siblings in a ``Sequential`` or functional model, but a subclassed model
  may hold two layers of the same name: the second (in definition order) gets ``_1``, the next
  ``_2`` (the first suffix no earlier sibling uses), as Keras numbers its automatic names.

A layer reachable twice (a shared layer, a layer used by two sub-models) keeps its first path, as
torch's ``named_modules()`` does. ``InputLayer`` is left out: it is a placeholder that no forward
calls. ``layer.path`` is not used: it is the variable scope at build time, ``None`` for layers
without weights and without the parent's prefix in a functional sub-model.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Keras 3 defines its base layer as keras.src.layers.layer.Layer; any class named Layer from a
# module under keras. is accepted, so a reorganised package layout still matches.
_KERAS_PACKAGE = "keras."
_INPUT_LAYER = "InputLayer"


def _keras_classes(obj: Any) -> Iterable[str]:
    """The names of the classes of ``obj``'s type that Keras defines (its MRO, Keras's part)."""
    for cls in type(obj).__mro__:
        if getattr(cls, "__module__", "").startswith(_KERAS_PACKAGE):
            yield cls.__qualname__


def is_keras_layer(obj: Any) -> bool:
    """Is ``obj`` a Keras layer (a model is one)? Looks only at its type's MRO: imports nothing."""
    return "Layer" in _keras_classes(obj)


def keras_backend_of(obj: Any) -> str | None:
    """The backend a Keras layer's class was built for (``"torch"``, ``"jax"``, ``"tensorflow"``),
    read from the backend base class in its MRO (``keras.src.backend.<name>.layer``); None when
    ``obj`` is no Keras layer or the layout is not one we know."""
    if not is_keras_layer(obj):
        return None
    for cls in type(obj).__mro__:
        parts = getattr(cls, "__module__", "").split(".")
        if len(parts) >= 4 and parts[0] == "keras" and parts[1] == "src" and parts[2] == "backend":
            return parts[3] if parts[3] != "common" else None
    return None


def _is_input_layer(obj: Any) -> bool:
    return _INPUT_LAYER in _keras_classes(obj)


def _children(layer: Any) -> list[Any]:
    """``layer``'s direct sublayers, in the order Keras tracks them (definition / graph order)."""
    flatten = getattr(layer, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=False, recursive=False))
    # the public list, on a Keras that no longer has the private walk (Model only)
    return list(getattr(layer, "layers", ()) or ())


def _segment(layer: Any, taken: set[str]) -> str:
    """The path segment of ``layer`` among siblings already named ``taken`` (the rules above)."""
    name = getattr(layer, "name", None)
    base = name.replace(".", "_") if isinstance(name, str) and name else type(layer).__name__
    if base not in taken:
        return base
    n = 1
    while f"{base}_{n}" in taken:
        n += 1
    return f"{base}_{n}"


def keras_layer_paths(model: Any) -> list[tuple[str, Any]]:
    """``(path, layer)`` for ``model`` (path ``""``) and every layer below it, depth first in the
    order Keras tracks them, each layer once (its first path). Paths follow the rules in this
    module's docstring."""
    out: list[tuple[str, Any]] = []
    seen: set[int] = set()
    # an explicit stack (children pushed reversed, so popped in order) instead of recursion: a
    # deeply nested model cannot hit the interpreter's recursion limit here
    stack: list[tuple[str, Any]] = [("", model)]
    while stack:
        path, layer = stack.pop()
        if id(layer) in seen:
            continue  # shared (or, in a malformed tree, its own ancestor): its first path stands
        seen.add(id(layer))
        out.append((path, layer))
        taken: set[str] = set()
        below: list[tuple[str, Any]] = []
        for child in _children(layer):
            if _is_input_layer(child):
                continue
            seg = _segment(child, taken)
            taken.add(seg)
            below.append((f"{path}.{seg}" if path else seg, child))
        stack.extend(reversed(below))
    return out


__all__ = ["is_keras_layer", "keras_backend_of", "keras_layer_paths"]
