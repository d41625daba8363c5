"""What every adapter's ``attach`` does whatever the framework: resolve the config, check the
arguments, pick the tracked layer paths, register the handle (``registry.register`` refuses a model
instrumented already).

An adapter supplies what is its own (the model's type check, its layer tree, the handle class);
this module imports no framework.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar

from ..capacity.shapes import ShapeOf
from ..config import AttributionConfig, Config, load_config
from ..errors import InstrumentationError
from . import live_handles as live
from .instrumentation import Instrumentation
from .selection import filters_selecting_nothing, select_layers

_log = logging.getLogger("memprof_otel")

H = TypeVar("H", bound=Instrumentation)


def _example_paths(paths: list[str], n: int = 4) -> str:
    """A few layer paths of the model, so a filter that matches nothing can be fixed at once."""
    below = [p for p in paths if p]
    more = f", ... {len(below)} in all" if len(below) > n else ""
    return "its paths look like " + ", ".join(repr(p) for p in below[:n]) + more if below else "no submodules"


def tracked_layers(layers: dict[str, Any], model_name: str, acfg: AttributionConfig) -> dict[int, str]:
    """``id(layer) -> the name its figures are kept under`` for the layers ``max_depth``,
    ``include``/``exclude`` and ``max_layers`` select from ``layers`` (path -> layer object); a
    filter that selects nothing is logged, naming a few real paths. The caller adds its root."""
    named = select_layers(layers, max_depth=acfg.max_depth, include=acfg.include,
                          exclude=acfg.exclude, max_layers=acfg.max_layers)
    for problem in filters_selecting_nothing(layers, max_depth=acfg.max_depth, include=acfg.include,
                                             exclude=acfg.exclude):
        _log.warning("memprof_otel: model %r: %s (%s); unselected layers count in their nearest "
                     "tracked ancestor", model_name, problem, _example_paths(list(layers)))
    return {id(layers[p]): label for p, label in named.items()}


def attach_handle(model: Any, name: str | None, config: Any, shape_of: ShapeOf | None,
                  overrides: dict[str, Any], make: Callable[[str, Config], H]) -> H:
    """Build and register the handle of ``model`` with ``make(chosen name, config)``.

    ``config`` None: defaults + env; a ``Config`` without overrides is used as it is (``mp.instrument``
    resolves the config tolerantly, bad env left out, before this); anything else is loaded strictly.
    """
    if isinstance(config, Config) and not overrides:
        cfg = config
    else:
        cfg = load_config(config, **overrides)
    if name is not None and (not isinstance(name, str) or not name):
        raise InstrumentationError(f"name must be a non-empty string, got {name!r}")
    if shape_of is not None and not callable(shape_of):
        raise InstrumentationError(f"shape_of must be a callable (args, kwargs) -> dict[str, int], "
                                   f"got {type(shape_of).__name__}")
    return live.register(model, name, type(model).__name__, lambda chosen: make(chosen, cfg))


__all__ = ["attach_handle", "tracked_layers"]
