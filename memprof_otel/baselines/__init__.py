"""Per-layer memory baselines, their diff and the gate a CI job puts on it (pure: no framework, no I/O
but reading and writing the baseline file).

``diff.py`` two baselines against thresholds: changed figures by bytes, layers added, removed, renamed
``from_layers.py`` a baseline from ``LayerMemoryStats`` dicts or a ``GET /v1/layers`` document
``render.py`` a diff as a fixed-width table (CI logs) or markdown (PR comments)
``schema.py`` the versioned baseline file, read with every field checked, written atomically
``shapes.py`` a forward's figures per layer, a shape's median and spread: what a measuring window keeps
``structure.py`` a model's structure apart from its names: the fingerprint, rename matching

Public: the baseline file format (docs/reference.md, Baselines), ``memprof-otel baseline save`` and
``memprof-otel diff``, and the pytest plugin's ``memprof_baseline`` fixture (``testing/``). The
names imported below are for those and the handle; the module paths are internal.
"""
from .diff import BaselineDiff, FigureChange, Thresholds, diff, parse_fail_above
from .from_layers import from_layers_document, from_shapes
from .schema import (FIGURES, SCHEMA, SCHEMA_VERSION, Baseline, BaselineError, LayerBaseline, from_dict, load,
                     loads, save)
from .structure import fingerprint

__all__ = ["FIGURES", "SCHEMA", "SCHEMA_VERSION", "Baseline", "BaselineDiff", "BaselineError", "FigureChange",
           "LayerBaseline", "Thresholds", "diff", "fingerprint", "from_dict", "from_layers_document", "from_shapes", "load",
           "loads", "parse_fail_above", "save"]
