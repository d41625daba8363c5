"""A ``Baseline`` from per-layer statistics: the ``LayerMemoryStats`` dicts a handle gives (Python)
or the ``GET /v1/layers`` document an endpoint serves (``memprof-otel baseline save``). Pure."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .schema import FIGURES, Baseline, BaselineError, LayerBaseline
from .shapes import ShapeFigures
from .structure import fingerprint

# LayerMemoryStats field -> baseline figure
_STATS_FIELDS = {"peak_increase_bytes": "peak_increase", "retained_bytes": "retained", "calls": "calls",
                 "allocations": "total_allocations", "deallocations": "total_deallocations"}
_COUNTS = ("calls", "allocations", "deallocations")


def _int(stats: Mapping[str, Any], key: str, where: str) -> int:
    value = stats.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise BaselineError(f"{where}.{key}", f"expected a number, got {value!r}")
    return int(value)


def build(model: str, stats: Mapping[str, Mapping[str, Any]], signatures: Mapping[str, str], *,
          inputs: Mapping[str, str] | None = None, environment: Mapping[str, str | None] | None = None,
          source: str = "python", forwards: int = 1, where: str = "layers") -> Baseline:
    """``stats``: path -> a ``LayerMemoryStats.to_dict()`` over ``forwards`` forwards (the counts are
    divided by it); ``signatures``: path -> signature in the
    model's order (the layers' order in the file; layers without one follow, by name). The
    fingerprint is over every layer's signature, tracked or not."""
    order = [p for p in signatures if p in stats] + sorted(p for p in stats if p not in signatures)
    per = max(1, forwards)

    def figures(p: str) -> dict[str, int]:
        out = {f: _int(stats[p], k, f"{where}.{p}") for f, k in _STATS_FIELDS.items()}
        # counts are totals over the forwards measured: per forward, an endpoint's baseline after
        # 1000 forwards compares with one measured on one
        for f in _COUNTS:
            out[f] = round(out[f] / per)
        return out

    layers = tuple(LayerBaseline(path=p, signature=signatures.get(p, ""), **figures(p)) for p in order)
    return Baseline(model=model, fingerprint=fingerprint(signatures) if signatures else fingerprint(
        {p: "" for p in stats}), layers=layers, inputs=dict(inputs or {}), environment=dict(environment or {}),
        source=source, forwards=forwards)


def from_layers_document(doc: Any, model: str | None, *, inputs: Mapping[str, str] | None = None,
                         environment: Mapping[str, str | None] | None = None) -> Baseline:
    """The baseline of ``model`` (the only model when None) in a ``GET /v1/layers`` document.
    ``environment`` adds to (and overrides) what the document says of the model's environment."""
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, dict):
        raise BaselineError("/v1/layers", "not a layers document (no 'models' object)")
    if model is None:
        if len(models) != 1:
            raise BaselineError("--model", f"the endpoint has {len(models)} models "
                                           f"({', '.join(sorted(models)) or 'none'}): name one")
        model = next(iter(models))
    entry = models.get(model)
    if not isinstance(entry, dict) or not isinstance(entry.get("layers"), dict):
        raise BaselineError("--model", f"no model {model!r} in the layers document")
    if not entry["layers"]:
        raise BaselineError("--model", f"model {model!r} has no per-layer figures yet: send it a forward "
                                       "(attributed) first")
    sigs = entry.get("structure") or {}
    env: dict[str, str | None] = {"device": entry.get("device")}
    env.update(entry.get("environment") or {})
    env.update(environment or {})
    root = entry["layers"].get("") or {}
    forwards = int(root.get("calls", 0)) if isinstance(root, dict) else 0
    return build(model, entry["layers"], sigs if isinstance(sigs, dict) else {}, inputs=inputs, environment=env,
                 source="endpoint", forwards=forwards, where=f"/v1/layers.models.{model}.layers")


def from_shapes(model: str, shapes: Sequence[ShapeFigures], signatures: Mapping[str, str], *,
                inputs: Mapping[str, str] | None = None,
                environment: Mapping[str, str | None] | None = None) -> Baseline:
    """The baseline of a measuring window (``POST /v1/baseline``): its shapes, and for the layers
    (the structure, and a reader of version 1) each figure's largest median over the shapes."""
    paths = {p for s in shapes for p in s.median}
    order = [p for p in signatures if p in paths] + sorted(p for p in paths if p not in signatures)
    layers = tuple(LayerBaseline(path=p, signature=signatures.get(p, ""),
                                 **{f: max(s.median[p][f] for s in shapes if p in s.median) for f in FIGURES})
                   for p in order)
    return Baseline(model=model, fingerprint=fingerprint(signatures) if signatures else fingerprint(
        {p: "" for p in paths}), layers=layers, inputs=dict(inputs or {}), environment=dict(environment or {}),
        source="endpoint", forwards=sum(s.forwards for s in shapes), shapes=tuple(shapes))
