"""One instrumented model's capacity answers: its memory model, fed by the handle after each
measured forward, and the questions a server and its operators ask of it."""
from __future__ import annotations

import time
from typing import Any, Mapping

from .._callouts import calls_application
from ..config import CapacityConfig
from .budget import CapacityFigures
from .budget_reader import BudgetReader
from .model import MemoryModel, Prediction
from .shapes import BATCH, CACHE_LEN, SEQ_LEN, Features, ShapeError, ShapeOf, checked, default_shape_of

TABLE_ROWS = 8  # sequence lengths in the max-safe-batch table when none are configured



@calls_application
def _call_shape_of(shape_of: ShapeOf, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    return shape_of(args, kwargs)


class Capacity:
    def __init__(self, config: CapacityConfig, shape_of: ShapeOf | None = None,
                 budgets: BudgetReader | None = None) -> None:
        self.config = config
        self.model = MemoryModel(config.max_shapes)
        self._shape_of = shape_of
        self.budgets = budgets or BudgetReader(config.margin_ratio, config.margin_bytes,
                                               limit_bytes=config.limit_bytes)
        self.shape_errors = 0
        self.root_readings = 0          # forwards read at their root only (capacity.root_readings)
        self.root_readings_dropped = 0  # of those, dropped: another forward ran on the device meanwhile

    # ---- fed by the handle -----------------------------------------------------------------
    def features(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Features | None:
        """The forward's shape, or None (no tensor, or a ``shape_of`` that failed: counted)."""
        if self._shape_of is None:
            return default_shape_of(args, kwargs) or None
        return checked(_call_shape_of(self._shape_of, args, kwargs)) or None

    def observe(self, features: Features, peak_increase: int, retained: int) -> None:
        self.model.observe(features, peak_increase, retained)

    # ---- questions -------------------------------------------------------------------------
    def predict(self, features: Mapping[str, int]) -> Prediction:
        return self.model.predict(checked(features))

    def fits(self, device: str, features: Mapping[str, int], unknown: bool = True) -> bool:
        """Would a forward of this shape fit now? The prediction plus its error against what the
        device has available; ``unknown`` when the model or the limit cannot answer."""
        p = self.model.predict(checked(features))
        if p.upper_bytes is None:
            return unknown
        budget, _ = self.budgets.read(device)
        if budget is None:
            return unknown
        return p.upper_bytes <= budget.available_bytes

    def table_seq_lens(self) -> list[int]:
        if self.config.seq_lens:
            return list(self.config.seq_lens)
        seen = sorted({r.features[SEQ_LEN] for r in self.model.shapes() if SEQ_LEN in r.features})
        return seen[-TABLE_ROWS:]

    def _fixed_others(self, shapes: list[Any], leave: set[str]) -> dict[str, int]:
        """Features other than those asked about: a KV cache's length at 0 (the table is of
        prompts: what a decode step adds is in use already, and the cache's growth is in the
        allocator's level), any other at its largest value seen (conservative)."""
        out: dict[str, int] = {}
        for r in shapes:
            for k, v in r.features.items():
                if k not in leave:
                    out[k] = 0 if k == CACHE_LEN else max(out.get(k, 0), v)
        return out

    def max_safe_batches(self, available: int) -> dict[int, int]:
        shapes = self.model.shapes()
        if not shapes or BATCH not in shapes[0].features:
            return {}
        others = self._fixed_others(shapes, {BATCH, SEQ_LEN})
        out = {}
        for s in self.table_seq_lens():
            n = self.model.max_safe(available, {**others, SEQ_LEN: s}, BATCH)
            if n is not None:
                out[s] = n
        return out

    def max_safe_seq_len(self, available: int, batch: int) -> int | None:
        shapes = self.model.shapes()
        if not shapes or SEQ_LEN not in shapes[0].features or BATCH not in shapes[0].features:
            return None
        others = self._fixed_others(shapes, {BATCH, SEQ_LEN})
        return self.model.max_safe(available, {**others, BATCH: batch}, SEQ_LEN)

    def figures(self, device: str, now_unix: float | None = None) -> CapacityFigures:
        now = time.time() if now_unix is None else now_unix
        budget, _ = self.budgets.read(device)
        largest = self.model.largest_recent(now - self.config.recent_window)
        predicted = measured = headroom = None
        if largest is not None:
            measured = largest.peak
            p = self.model.predict(largest.features)
            if p.peak_bytes is not None:
                predicted = float(p.peak_bytes)
                if budget is not None and p.upper_bytes is not None:
                    headroom = float(budget.available_bytes - p.upper_bytes)
        table = self.max_safe_batches(budget.available_bytes) if budget is not None else {}
        return CapacityFigures(device, predicted, measured, headroom, self.model.error_ratio, table, budget)

    def answer(self, device: str, features: Mapping[str, int] | None) -> dict[str, Any]:
        """The ``/v1/headroom`` document for this model (``features`` None: the table)."""
        budget, why_no_limit = self.budgets.read(device)
        doc: dict[str, Any] = {"device": device, "model_fit": self.model.describe(),
                               "budget": budget.to_dict() if budget is not None else None,
                               "budget_reason": why_no_limit,
                               "shapes": [r.to_dict() for r in sorted(self.model.shapes(),
                                                                      key=lambda r: sorted(r.features.items()))],
                               "shape_errors": self.shape_errors, "root_readings": self.root_readings,
                               "root_readings_dropped": self.root_readings_dropped}
        if features is not None:
            p = self.predict(features)
            doc["prediction"] = p.to_dict()
            fits = None
            if p.upper_bytes is not None and budget is not None:
                fits = p.upper_bytes <= budget.available_bytes
                doc["headroom_bytes"] = budget.available_bytes - p.upper_bytes
            doc["fits"] = fits
            return doc
        if budget is not None:
            doc["max_safe_batch"] = {str(k): v for k, v in self.max_safe_batches(budget.available_bytes).items()}
            if self.config.batch is not None:
                doc["max_safe_seq_len"] = {"batch": self.config.batch,
                                           "seq_len": self.max_safe_seq_len(budget.available_bytes,
                                                                            self.config.batch)}
        return doc


__all__ = ["Capacity", "CapacityFigures", "ShapeError"]
