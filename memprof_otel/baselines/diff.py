"""Two baselines compared: the figures that changed, ranked by bytes, the layers added, removed and
renamed, what differs in the environment, and which changes exceed the thresholds a CI job sets.

Only growth fails: a layer whose peak increase or retained bytes grew by more than the relative
threshold (``fail_above``, 0.02 for 2 %) and by more than the absolute one (``fail_above_bytes``) —
both where both are set, so that 128 B -> 256 B (+100 %) does not fail a job asking for 2 % and
64 KiB. A layer added or removed is listed and fails nothing by itself: the root layer (``""``, the
whole forward) carries what it does to memory. Pure: baselines in, a ``BaselineDiff`` out.

Where both baselines hold figures per input shape (``shapes``: a live endpoint's measuring window),
like is compared with like: a figure only with the same figure on the same shape, its median over
that shape's forwards. A change is one beyond the noise, the larger of the two sides' spreads over
repeat forwards of that shape, and the thresholds apply to what lies beyond it. A shape only one
side measured is listed, never judged; a shape with fewer than ``MIN_FORWARDS`` forwards on either
side has no known noise, and its figures are named unknown, not changed. Forwards whose shape was
not read (the memory model off, a ``shape_of`` that raised) are of unknown shapes: never judged.
A per-shape diff that could compare no shape fails a gate that set a threshold: a gate that passes
on nothing is no gate.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .schema import BYTE_FIGURES, FIGURES, Baseline, LayerBaseline
from .shapes import MIN_FORWARDS
from .structure import match_renames, subtrees


def parse_fail_above(value: object, name: str = "fail_above") -> float:
    """A relative threshold as users write it, ``"2%"``, to the fraction the diff uses (0.02). Only the
    form with ``%`` is taken: a bare 0.02 is 2 % to some readers and 0.02 % to others, so it is
    refused (``ValueError`` with one line saying how to write it)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        raw = value.strip()[:-1].strip()
        try:
            pct = float(raw)
        except ValueError:
            pct = float("nan")
        if pct == pct and 0 <= pct < float("inf"):
            return pct / 100.0
        raise ValueError(f"{name} {value!r}: expected a percentage >= 0, e.g. 2% or 0.5%")
    raise ValueError(f"{name} {value!r}: write it as a percentage with its sign, e.g. '2%' "
                     "(a bare number is refused: 0.02 could mean 2 % or 0.02 %)")


@dataclass(frozen=True)
class Thresholds:
    """``fail_above``: relative growth (0.02 = 2 %); ``fail_above_bytes``: absolute growth. None: unset.
    With neither set nothing fails."""
    fail_above: float | None = None
    fail_above_bytes: int | None = None

    @property
    def any(self) -> bool:
        return self.fail_above is not None or self.fail_above_bytes is not None

    def exceeded(self, old: int, new: int, noise: int = 0) -> bool:
        """``new`` grew past the thresholds, counting only what lies beyond ``noise``."""
        if not self.any or new - old <= noise:
            return False
        delta = new - old - noise
        if self.fail_above_bytes is not None and delta <= self.fail_above_bytes:
            return False
        if self.fail_above is not None and old > 0 and delta <= self.fail_above * old:
            return False
        return True  # from 0 any growth is past a relative threshold


@dataclass(frozen=True)
class FigureChange:
    """One figure of one layer that differs. ``layer`` is its path in the new baseline; ``old_layer``
    its path in the old one (different when it was renamed). ``relative`` is None from 0."""
    layer: str
    old_layer: str
    figure: str
    old: int
    new: int
    exceeds: bool = False
    shape: str | None = None   # the input shape it was measured on (per-shape baselines), else None
    noise: int = 0             # the spread of repeat forwards of that shape, the larger side's

    @property
    def delta(self) -> int:
        return self.new - self.old

    @property
    def relative(self) -> float | None:
        return self.delta / self.old if self.old else None

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "old_layer": self.old_layer, "figure": self.figure, "old": self.old,
                "new": self.new, "delta": self.delta, "relative": self.relative, "exceeds": self.exceeds,
                "shape": self.shape, "noise": self.noise}


@dataclass(frozen=True)
class BaselineDiff:
    old_model: str
    new_model: str
    changes: tuple[FigureChange, ...]          # byte figures first, largest |delta| first, then counts
    added: tuple[LayerBaseline, ...]
    removed: tuple[LayerBaseline, ...]
    renamed: tuple[tuple[str, str], ...]       # (old path, new path)
    environment: dict[str, tuple[str | None, str | None]]  # fact -> (old, new), only those that differ
    inputs: dict[str, tuple[str | None, str | None]]       # input -> (old, new), only those that differ
    structure_changed: bool                    # the fingerprints differ
    thresholds: Thresholds = field(default_factory=Thresholds)
    per_shape: bool = False                    # compared shape by shape (both sides kept shapes)
    shapes_compared: tuple[str, ...] = ()      # the shapes both sides measured enough
    shapes_only_old: tuple[str, ...] = ()      # measured on one side only: listed, never judged
    shapes_only_new: tuple[str, ...] = ()
    shapes_too_few: tuple[tuple[str, int, int], ...] = ()  # (shape, old forwards, new forwards): unknown
    unread_forwards: tuple[int, int] = (0, 0)  # forwards whose shape was not read (old, new): not judged

    @property
    def failures(self) -> tuple[FigureChange, ...]:
        return tuple(c for c in self.changes if c.exceeds)

    @property
    def judged_nothing(self) -> bool:
        """Per shape, and no shape could be compared: nothing was judged."""
        return self.per_shape and not self.shapes_compared

    @property
    def failed(self) -> bool:
        """What a gate exits on: a figure past the thresholds, or, with a threshold set, nothing judged."""
        return bool(self.failures) or (self.thresholds.any and self.judged_nothing)

    @property
    def unchanged(self) -> bool:
        return not (self.changes or self.added or self.removed or self.renamed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "old_model": self.old_model, "new_model": self.new_model,
            "failed": self.failed,
            "thresholds": {"fail_above": self.thresholds.fail_above,
                           "fail_above_bytes": self.thresholds.fail_above_bytes},
            "changes": [c.to_dict() for c in self.changes],
            "added": [lay.to_dict() for lay in self.added],
            "removed": [lay.to_dict() for lay in self.removed],
            "renamed": [{"old": o, "new": n} for o, n in self.renamed],
            "environment": {k: {"old": o, "new": n} for k, (o, n) in self.environment.items()},
            "inputs": {k: {"old": o, "new": n} for k, (o, n) in self.inputs.items()},
            "structure_changed": self.structure_changed,
            "per_shape": self.per_shape,
            "shapes": {"compared": list(self.shapes_compared), "only_old": list(self.shapes_only_old),
                       "only_new": list(self.shapes_only_new),
                       "too_few_forwards": [{"shape": k, "old_forwards": a, "new_forwards": b}
                                            for k, a, b in self.shapes_too_few],
                       "unread_forwards": {"old": self.unread_forwards[0], "new": self.unread_forwards[1]},
                       "min_forwards": MIN_FORWARDS},
        }


def _differing(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def _rank(c: FigureChange) -> tuple[int, int, str, int]:
    # bytes before counts, then the largest change (either way) first; ties by path and figure order
    return (0 if c.figure in BYTE_FIGURES else 1, -abs(c.delta), c.layer, FIGURES.index(c.figure))


def diff(old: Baseline, new: Baseline, thresholds: Thresholds | None = None) -> BaselineDiff:
    """What changed from ``old`` to ``new`` (see the module docstring for what fails)."""
    limits = thresholds or Thresholds()
    old_paths = [lay.path for lay in old.layers]
    new_paths = {lay.path for lay in new.layers}
    removed = [p for p in old_paths if p not in new_paths]
    added = [lay.path for lay in new.layers if lay.path not in set(old_paths)]
    renamed = match_renames(removed, added,
                            subtrees({lay.path: lay.signature for lay in old.layers}),
                            subtrees({lay.path: lay.signature for lay in new.layers}))
    pairs = [(p, p) for p in old_paths if p in new_paths] + renamed
    changes: list[FigureChange] = []
    per_shape = bool(old.shapes) and bool(new.shapes)
    compared: list[str] = []
    too_few: list[tuple[str, int, int]] = []
    olds, news = {s.key: s for s in old.shapes}, {s.key: s for s in new.shapes}
    if per_shape:
        for key in [k for k in olds if k in news and k]:
            a_s, b_s = olds[key], news[key]
            if min(a_s.forwards, b_s.forwards) < MIN_FORWARDS:
                too_few.append((key, a_s.forwards, b_s.forwards))
                continue
            compared.append(key)
            changes.extend(_changes(a_s.median, b_s.median, pairs, limits, key, a_s.spread, b_s.spread))
    else:  # one figure per layer, exact: no noise
        changes.extend(_changes({lay.path: lay.to_dict() for lay in old.layers},
                                {lay.path: lay.to_dict() for lay in new.layers}, pairs, limits))
    gone = {o for o, _ in renamed}
    came = {n for _, n in renamed}
    return BaselineDiff(
        old_model=old.model, new_model=new.model, changes=tuple(sorted(changes, key=_rank)),
        added=tuple(lay for lay in new.layers if lay.path in set(added) - came),
        removed=tuple(lay for lay in old.layers if lay.path in set(removed) - gone),
        renamed=tuple(renamed),
        environment=_differing(dict(old.environment), dict(new.environment)),
        inputs=_differing(dict(old.inputs), dict(new.inputs)),
        structure_changed=old.fingerprint != new.fingerprint, thresholds=limits, per_shape=per_shape,
        shapes_compared=tuple(compared),
        shapes_only_old=tuple(k for k in olds if k not in news and k) if per_shape else (),
        shapes_only_new=tuple(k for k in news if k not in olds and k) if per_shape else (),
        shapes_too_few=tuple(too_few),
        unread_forwards=(olds[""].forwards if "" in olds else 0, news[""].forwards if "" in news else 0))


Figures = Mapping[str, Mapping[str, int]]  # layer path -> figure -> value


def _changes(old: Figures, new: Figures, pairs: list[tuple[str, str]], limits: Thresholds,
             shape: str | None = None, old_spread: Figures | None = None,
             new_spread: Figures | None = None) -> list[FigureChange]:
    """The figures of the matched layers that moved beyond the noise (the larger side's spread of
    repeat forwards of ``shape``; none for one exact figure per layer)."""
    out = []
    for old_path, new_path in pairs:
        fa, fb = old.get(old_path), new.get(new_path)
        if fa is None or fb is None:
            continue
        sa, sb = (old_spread or {}).get(old_path, {}), (new_spread or {}).get(new_path, {})
        for f in FIGURES:
            noise = max(sa.get(f, 0), sb.get(f, 0))
            if abs(fb[f] - fa[f]) > noise:
                exceeds = f in BYTE_FIGURES and limits.exceeded(fa[f], fb[f], noise)
                out.append(FigureChange(new_path, old_path, f, fa[f], fb[f], exceeds, shape, noise))
    return out
