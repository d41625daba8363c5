"""The baseline file: one model's per-layer figures for given inputs, with what produced them.

A baseline is a JSON document with a versioned schema (``SCHEMA``, ``SCHEMA_VERSION``; the fields are
in docs/reference.md, "Baselines"). Version 2 adds ``shapes``: the figures per input shape, each the
median over that shape's forwards with their spread (``shapes.py``), which a baseline taken from a
live endpoint holds and a diff compares like with like. It holds only figures that are the same on every run of the same
model, inputs and environment on the CPU tensor ledger (peak increase, retained bytes, calls,
allocation counts) and no timestamp, so that writing it again with nothing changed gives the same
bytes (a baseline checked into a repository changes only when memory does). Forward time and absolute
levels (``peak_allocated``: whatever else the process holds) are left out: they are not the model's.

Pure: dicts in, dicts out; reading and writing files is ``load``/``save`` at the bottom.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import ConfigError
from ..files import write_bytes_atomic
from .shapes import ShapeFigures, to_doc

SCHEMA = "memprof-otel/baseline"
SCHEMA_VERSION = 2
# the figures of a layer a baseline keeps, in the order the file and the tables show them
FIGURES: tuple[str, ...] = ("peak_increase_bytes", "retained_bytes", "calls", "allocations", "deallocations")
# the figures a diff judges against --fail-above (bytes); the counts are shown when they change
BYTE_FIGURES: tuple[str, ...] = ("peak_increase_bytes", "retained_bytes")


class BaselineError(ConfigError):
    """A baseline document that is not one (bad JSON, another schema, a newer version, a bad field).
    A ``ConfigError`` (``key``: where in the document or which file): bad input, exit 2 from the CLI."""


@dataclass(frozen=True)
class LayerBaseline:
    """One layer: its path, its structural signature (the layer's type and its own parameters'
    shapes, "" where not known) and its figures: the byte figures are maxima over its calls in the
    forwards measured; ``calls``, ``allocations`` and ``deallocations`` are per forward (the totals
    divided by the forwards, rounded)."""
    path: str
    signature: str = ""
    peak_increase_bytes: int = 0
    retained_bytes: int = 0
    calls: int = 0
    allocations: int = 0
    deallocations: int = 0

    def figure(self, name: str) -> int:
        return int(getattr(self, name))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "signature": self.signature, **{f: self.figure(f) for f in FIGURES}}


@dataclass(frozen=True)
class Baseline:
    """A model's per-layer figures for given inputs. ``layers`` in the model's order (parents before
    their children) where the structure is known; ``environment`` maps a fact (``torch``, ``device``,
    ``attention``...) to its value, None where not known; ``inputs`` names each input and its shape."""
    model: str
    fingerprint: str
    layers: tuple[LayerBaseline, ...]
    inputs: Mapping[str, str] = field(default_factory=dict)
    environment: Mapping[str, str | None] = field(default_factory=dict)
    source: str = "python"  # "python" (measured here) or "endpoint" (read from /v1/layers or a window)
    forwards: int = 1       # the forwards measured (from an endpoint: all it attributed)
    shapes: tuple[ShapeFigures, ...] = ()  # per input shape (a measuring window); () where not kept

    def layer(self, path: str) -> LayerBaseline | None:
        return next((lay for lay in self.layers if lay.path == path), None)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
                "model": {"name": self.model, "fingerprint": self.fingerprint, "layers": len(self.layers)},
                "inputs": dict(self.inputs), "environment": dict(self.environment),
                "source": self.source, "forwards": self.forwards,
                "layers": [lay.to_dict() for lay in self.layers],
                **({"shapes": [to_doc(s) for s in self.shapes]} if self.shapes else {})}

    def dumps(self) -> str:
        """The file's text: keys in a fixed order, two-space indent, a final newline."""
        return json.dumps(self.to_dict(), indent=2) + "\n"


# ---- reading: every field checked, with where it is wrong --------------------------------------

def _field(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise BaselineError(where, f"missing {key!r}")
    value = doc[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BaselineError(f"{where}.{key}", f"expected {names}, got {type(value).__name__}")
    return value


def _str_map(value: Any, where: str, nullable: bool) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BaselineError(where, f"expected an object, got {type(value).__name__}")
    for k, v in value.items():
        if not (isinstance(v, str) or (nullable and v is None)):
            raise BaselineError(f"{where}.{k}", f"expected a string{' or null' if nullable else ''}")
    return dict(value)


def _layer(doc: Any, where: str) -> LayerBaseline:
    if not isinstance(doc, dict):
        raise BaselineError(where, "expected an object")
    figures = {f: _field(doc, f, int, where) for f in FIGURES}
    for f in ("calls", "allocations", "deallocations", "peak_increase_bytes"):
        if figures[f] < 0:
            raise BaselineError(f"{where}.{f}", f"must be >= 0, got {figures[f]}")
    return LayerBaseline(path=_field(doc, "path", str, where),
                         signature=str(doc.get("signature") or ""), **figures)


def _figure_map(value: Any, where: str) -> dict[str, dict[str, int]]:
    if not isinstance(value, dict):
        raise BaselineError(where, "expected an object")
    out: dict[str, dict[str, int]] = {}
    for path, figs in value.items():
        if not isinstance(figs, dict):
            raise BaselineError(f"{where}.{path}", "expected an object")
        for f in FIGURES:
            v = figs.get(f)
            if not isinstance(v, int) or isinstance(v, bool):
                raise BaselineError(f"{where}.{path}.{f}", f"expected an integer, got {v!r}")
            if v < 0 and (f != "retained_bytes" or "spread" in where):  # a layer may free what it got
                raise BaselineError(f"{where}.{path}.{f}", f"must be >= 0, got {v}")
        out[str(path)] = {f: int(figs[f]) for f in FIGURES}
    return out


def _shape(doc: Any, where: str) -> ShapeFigures:
    if not isinstance(doc, dict):
        raise BaselineError(where, "expected an object")
    features = _field(doc, "features", dict, where)
    for k, v in features.items():
        if not isinstance(v, int) or isinstance(v, bool):
            raise BaselineError(f"{where}.features.{k}", f"expected an integer, got {v!r}")
    forwards = _field(doc, "forwards", int, where)
    if forwards < 1:
        raise BaselineError(f"{where}.forwards", f"must be >= 1, got {forwards}")
    layers = _field(doc, "layers", dict, where)
    median = _figure_map({p: (d or {}).get("median") if isinstance(d, dict) else None for p, d in layers.items()},
                         f"{where}.layers(median)")
    spread = _figure_map({p: (d or {}).get("spread") if isinstance(d, dict) else None for p, d in layers.items()},
                         f"{where}.layers(spread)")
    return ShapeFigures(dict(features), forwards, median, spread)


def from_dict(doc: Any, where: str = "baseline") -> Baseline:
    """A ``Baseline`` from its JSON document; a ``BaselineError`` naming the bad field otherwise."""
    if not isinstance(doc, dict):
        raise BaselineError(where, "expected a JSON object")
    if doc.get("schema") != SCHEMA:
        raise BaselineError(where, f"not a memprof-otel baseline (schema {doc.get('schema')!r}, "
                                   f"expected {SCHEMA!r})")
    version = _field(doc, "schema_version", int, where)
    if version > SCHEMA_VERSION:
        raise BaselineError(where, f"schema_version {version} is newer than this memprof-otel reads "
                                   f"({SCHEMA_VERSION}): upgrade memprof-otel")
    if version < 1:
        raise BaselineError(where, f"schema_version must be >= 1, got {version}")
    model = _field(doc, "model", dict, where)
    layers_doc = _field(doc, "layers", list, where)
    layers = tuple(_layer(d, f"{where}.layers[{i}]") for i, d in enumerate(layers_doc))
    paths = [lay.path for lay in layers]
    if len(set(paths)) != len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise BaselineError(f"{where}.layers", f"layer {dup!r} appears twice")
    forwards = doc.get("forwards", 1)
    if not isinstance(forwards, int) or isinstance(forwards, bool) or forwards < 0:
        raise BaselineError(f"{where}.forwards", f"expected an integer >= 0, got {forwards!r}")
    return Baseline(model=_field(model, "name", str, f"{where}.model"),
                    fingerprint=_field(model, "fingerprint", str, f"{where}.model"),
                    layers=layers,
                    inputs=_str_map(doc.get("inputs", {}), f"{where}.inputs", nullable=False),
                    environment=_str_map(doc.get("environment", {}), f"{where}.environment", nullable=True),
                    source=str(doc.get("source") or "python"), forwards=forwards,
                    shapes=_shapes(doc.get("shapes", []), f"{where}.shapes"))


def _shapes(value: Any, where: str) -> tuple[ShapeFigures, ...]:
    shapes = tuple(_shape(d, f"{where}[{i}]") for i, d in enumerate(_list(value, where)))
    keys = [s.key for s in shapes]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise BaselineError(where, f"shape {dup or '(not read)'!r} appears twice")
    return shapes


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise BaselineError(where, f"expected a list, got {type(value).__name__}")
    return value


def loads(text: str | bytes, where: str = "baseline") -> Baseline:
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise BaselineError(where, f"not JSON: {e}") from None
    return from_dict(doc, where)


def load(path: str | os.PathLike[str]) -> Baseline:
    """Read a baseline file (``OSError`` when it cannot be read, ``BaselineError`` when it is not one)."""
    with open(path, "rb") as f:
        return loads(f.read(), os.fspath(path))


def save(baseline: Baseline, path: str | os.PathLike[str]) -> None:
    """Write it atomically (a CI job killed mid-write never leaves half a baseline)."""
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    write_bytes_atomic(baseline.dumps().encode(), path)
