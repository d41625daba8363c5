"""A model's structure, independent of its layer names: the fingerprint a baseline carries and the
shapes a diff matches renamed layers by.

A layer's *signature* is what the adapter reads off the layer object (its type and its own
parameters' shapes and dtypes, e.g. ``Linear(weight=float32[64,16],bias=float32[64])``). Its
*subtree* is its signature with its children's subtrees in order, names left out: two layers with
the same subtree are the same computation under another name. Pure: paths and strings in.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence


def parent(path: str) -> str | None:
    """``a.b.c`` -> ``a.b``; a top-level layer's parent is the root ``""``; the root has none."""
    if path == "":
        return None
    return path.rpartition(".")[0]


def subtrees(signatures: Mapping[str, str]) -> dict[str, str]:
    """Path -> a digest of its subtree (its signature and, in order, its children's subtrees). The
    order of ``signatures`` is the model's (parents before children, children in definition order)."""
    children: dict[str, list[str]] = {p: [] for p in signatures}
    for p in signatures:
        up = parent(p)
        # a layer whose parent is not tracked (max_depth, include/exclude) hangs off its nearest
        # tracked ancestor
        while up is not None and up not in children:
            up = parent(up)
        if up is not None:
            children[up].append(p)
    out: dict[str, str] = {}

    def walk(p: str) -> str:
        if p not in out:
            inner = ",".join(walk(c) for c in children[p])
            # "" for a layer without a signature: nothing says two such layers are the same
            out[p] = _digest(f"{signatures[p]}[{inner}]") if signatures[p] else ""
        return out[p]

    for p in reversed(list(signatures)):  # children first: the recursion stays shallow
        walk(p)
    return out


def fingerprint(signatures: Mapping[str, str]) -> str:
    """The whole model's structure, names included: equal fingerprints mean the same layers under the
    same paths. ``sha256:`` and 16 hex digits (enough to tell models apart; it is no security)."""
    text = "\n".join(f"{p}\t{s}" for p, s in sorted(signatures.items()))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def match_renames(removed: Sequence[str], added: Sequence[str], old_subtrees: Mapping[str, str],
                  new_subtrees: Mapping[str, str]) -> list[tuple[str, str]]:
    """Pairs (old path, new path) of layers that went away under one name and came back under another
    with the same subtree. Layers of one subtree are paired in the model's order (``removed`` and
    ``added`` are in it): renaming ``h`` to ``blocks`` pairs ``h.0`` with ``blocks.0``, ``h.1`` with
    ``blocks.1``. A layer without a known signature is never matched (nothing says it is the same)."""
    by_shape: dict[str, list[str]] = {}
    for p in added:
        shape = new_subtrees.get(p)
        if shape:
            by_shape.setdefault(shape, []).append(p)
    pairs: list[tuple[str, str]] = []
    for p in removed:
        shape = old_subtrees.get(p)
        waiting = by_shape.get(shape or "")
        if shape and waiting:
            pairs.append((p, waiting.pop(0)))
    return pairs
