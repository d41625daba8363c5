"""What every adapter's ``attach`` does whatever the framework: resolve the config, check the
arguments, refuse a model instrumented already, pick the tracked layer paths, register the handle.

An adapter supplies what is its own (the model's type check, its layer tree, the handle class);
this module imports no framework.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, TypeVar

from ..capacity.shapes import ShapeOf
from ..config import AttributionConfig, Config, load_config
from ..errors import AlreadyInstrumented, InstrumentationError
from . import registry as live
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
                  overrides: dict[str, Any], instrumented: "weakref.WeakKeyDictionary[Any, Any]",
                  make: Callable[[str, Config], H]) -> H:
    """Build, register and record the handle of ``model`` with ``make(chosen name, config)``;
    ``instrumented`` is the adapter's table of live handles by model (weak: a dropped model goes).

    ``config`` None: defaults + env; a ``Config`` without overrides is used as it is (``mp.instrument``
    resolves the config tolerantly, bad env left out, before this); anything else is loaded strictly.
    """
    if isinstance(config, Config) and not overrides:
        cfg = config
    else:
        cfg = load_config(config, **overrides)
    if name is not None and (not isinstance(name, str) or not name):
        raise InstrumentationError(f"name must be a non-empty string, got {name!r}")
    existing = instrumented.get(model)
    if existing is not None and not existing._closed:
        raise AlreadyInstrumented(f"this {type(model).__name__} is already instrumented as "
                                  f"{existing.name!r}; call uninstrument() on that handle first")
    if shape_of is not None and not callable(shape_of):
        raise InstrumentationError(f"shape_of must be a callable (args, kwargs) -> dict[str, int], "
                                   f"got {type(shape_of).__name__}")
    h = live.register(name, type(model).__name__, lambda chosen: make(chosen, cfg))
    instrumented[model] = h
    return h


def forget(instrumented: "weakref.WeakKeyDictionary[Any, Any]", model: Any, h: Instrumentation) -> None:
    """Drop ``model``'s record in its adapter's table if it is still ``h``'s."""
    if model is not None and instrumented.get(model) is h:
        del instrumented[model]


__all__ = ["attach_handle", "forget", "tracked_layers"]
