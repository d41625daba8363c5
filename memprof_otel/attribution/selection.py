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


def filters_selecting_nothing(paths: Iterable[str], *, max_depth: int | None, include: tuple[str, ...],
                              exclude: tuple[str, ...]) -> list[str]:
    """The layer filters that select nothing, as sentences naming them: a ``max_depth`` that leaves
    only the root, each ``include`` pattern that matches no module path (a typo would otherwise
    silently turn per-layer attribution into root-only, or drop the layers it meant), an
    ``exclude`` that removes everything ``include`` kept. Empty for a model without submodules.
    """
    below = [p for p in paths if p != ""]
    if not below:
        return []
    in_depth = [p for p in below if max_depth is None or path_depth(p) <= max_depth]
    if not in_depth:
        return [f"attribution.max_depth {max_depth} tracks the root module only"]
    out = [f"attribution.include pattern {g!r} matches no module path within max_depth"
           for g in include if not any(fnmatchcase(p, g) for p in in_depth)]
    included = [p for p in in_depth if not include or any(fnmatchcase(p, g) for g in include)]
    if included and exclude and all(any(fnmatchcase(p, g) for g in exclude) for p in included):
        out.append(f"attribution.exclude {list(exclude)} excludes every module path include selects")
    return out
