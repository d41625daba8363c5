"""Which module paths get their own per-layer frame, and which fold into ``__other__``."""
from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

OTHER = "__other__"


def path_depth(path: str) -> int:
    return 0 if path == "" else path.count(".") + 1


def select_layers(paths: Iterable[str], *, max_depth: int | None, include: tuple[str, ...],
                  exclude: tuple[str, ...], max_layers: int) -> dict[str, str]:
    """Map each tracked module path to the name its figures are kept under.

    The root ("") is always tracked. Paths deeper than ``max_depth``, not matching any ``include``
    glob (when given) or matching an ``exclude`` glob are not tracked at all: their memory counts
    in their nearest tracked ancestor. Past ``max_layers`` names (root included, in module order),
    tracked paths keep their frame but are named ``__other__`` so exported cardinality stays bounded.
    """
    out: dict[str, str] = {}
    named = 0
    for p in paths:
        if p != "":
            if max_depth is not None and path_depth(p) > max_depth:
                continue
            if include and not any(fnmatchcase(p, g) for g in include):
                continue
            if exclude and any(fnmatchcase(p, g) for g in exclude):
                continue
        if named < max_layers or p == "":
            out[p] = p
            named += 1
        else:
            out[p] = OTHER
    return out
