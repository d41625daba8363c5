"""Per-layer memory baselines, their diff and the gate a CI job puts on it (pure: no framework, no I/O
but reading and writing the baseline file).

``schema`` the versioned file, ``structure`` a model's structure apart from its names (fingerprint,
rename matching), ``diff`` two baselines compared against thresholds, ``render`` the diff as a text
table or markdown, ``from_layers`` a baseline from the ``GET /v1/layers`` document of an endpoint.
"""
from .diff import BaselineDiff, FigureChange, Thresholds, diff, parse_fail_above
from .from_layers import from_layers_document, from_shapes
from .schema import (FIGURES, SCHEMA, SCHEMA_VERSION, Baseline, BaselineError, LayerBaseline, from_dict, load,
                     loads, save)
from .structure import fingerprint

__all__ = ["FIGURES", "SCHEMA", "SCHEMA_VERSION", "Baseline", "BaselineDiff", "BaselineError", "FigureChange",
           "LayerBaseline", "Thresholds", "diff", "fingerprint", "from_dict", "from_layers_document", "from_shapes", "load",
           "loads", "parse_fail_above", "save"]
