"""One instrumented model's capacity answers: its memory model, fed by the handle after each
measured forward, and the questions a server and its operators ask of it.

Two tables learn the same forwards: one in tensor bytes (the per-layer figures' unit) and one in
the units the forward's limit counts, where they are read (``attribution/kernel_reading.py``: the
rise of the process's resident high-water mark on CPU, the growth of the CUDA allocator's reserved
bytes). The answers come from the second as soon as its fit answers; until then from the tensor
fit, with its upper bound raised by the largest gap seen between the two figures of one shape.
Every answer says which unit it is in (``unit``) and, when tensor, why (``unit_note``).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Mapping, NamedTuple

from .._callouts import calls_application
from ..config import CapacityConfig
from ..sources import mmap_threshold, process_hwm, registry
from .memory_budget import CUDA_RESERVED, PROCESS_RESIDENT, TENSOR, CapacityFigures
from .memory_budget_reader import MemoryBudgetReader, resident_now
from ..errors import ShapeError
from .model import PREFILL, FitState, MemoryModel, Prediction, SafeLimit, family_of, key_of, names_text, regime_of
from .shapes import BATCH, CACHE_LEN, LOGITS, SEQ_LEN, Features, ShapeOf, canonical, checked, default_shape_of

TABLE_ROWS = 8  # sequence lengths in the max-safe-batch table when none are configured
# shapes whose tensor peak is under this say nothing of the gap between the two figures: the
# resident figure moves in pages and with whatever else the heap did meanwhile
GAP_MIN_BYTES = 1 << 20
# a forward whose figure in its limit's units is at most this times its tensor figure was read on a
# warm heap (gap_ratio); a fresh heap's first touches measured 1.13-2.1x on CPU
WARM_RATIO = 1.05


class Answering(NamedTuple):
    """Which table answers, in which unit, and what its upper bounds get on top: ``scale`` (a
    factor) and ``extra`` (bytes); ``note``: why the answer is not in the limit's units, or None."""
    model: MemoryModel
    unit: str
    scale: float
    extra: float
    note: str | None


_UNIT_WORDS = {PROCESS_RESIDENT: "the process's resident memory", CUDA_RESERVED: "the CUDA allocator's reserved bytes"}



def _ratios_over_floor(both: list[tuple[float, float]]) -> list[float]:
    """The ratios of the shapes (tensor figure, figure in the limit's units) whose tensor figure is
    at least GAP_MIN_BYTES and a quarter of the largest."""
    floor = max([GAP_MIN_BYTES] + [t / 4 for t, _ in both])
    return [k / t for t, k in both if t >= floor]


@calls_application
def _call_shape_of(shape_of: ShapeOf, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    return shape_of(args, kwargs)


class Capacity:
    def __init__(self, config: CapacityConfig, shape_of: ShapeOf | None = None,
                 budgets: MemoryBudgetReader | None = None) -> None:
        self.config = config
        standard = shape_of is None  # the default features: their names are known before any forward
        self.model = MemoryModel(config.max_shapes, standard=standard)   # tensor figures
        self.kernel = MemoryModel(config.max_shapes, standard=standard)  # the same forwards in the units their limit counts
        self.kernel_unit: str | None = None           # which units (None: no such reading yet)
        self.kernel_readings = 0
        self._observed = 0  # forwards observed: what _both()'s cached answer was computed at
        self._both_cache: tuple[int, list[tuple[float, float]]] = (-1, [])
        self._logits_cache: tuple[int, int | None] = (-1, None)
        # the CPU forward with the largest tensor figure read in resident bytes: (tensor figure, the
        # process's resident level it reached, the rise that took it there)
        self._top: tuple[float, int, int] | None = None
        self._gap_high: float | None = None  # the largest allowance learnt (_learn_gap): never lowered
        self._shape_of = shape_of
        self.budgets = budgets or MemoryBudgetReader(config.margin_ratio, config.margin_bytes,
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

    def new_kind(self, features: Features) -> str | None:
        """The regime (``prefill``, ``decode``) of a shape worth an attributed forward
        (``MemoryModel.worth_measuring``: not measured yet, and its kind has few shapes or it lies
        outside their range), None for one that would teach little (``capacity.learning_budget``)."""
        return regime_of(canonical(features)) if self.model.worth_measuring(features) else None

    def observe(self, features: Features, peak_increase: int, retained: int, kernel: Any = None) -> None:
        """One measured forward: its tensor figures and, where read, ``kernel``: the same forward in
        its limit's units (``unit``, ``peak_increase``, ``retained``)."""
        self.model.observe(features, peak_increase, retained)
        self._observed += 1
        if kernel is None:
            self._learn_gap()  # a shape's tensor figure moves its ratio too
            return
        # never below the tensor figure: a forward served from pages the heap kept resident, or from
        # the CUDA allocator's cached segments, raised the kernel's count less than it needed; a
        # larger one would not find them all (its figure would be extrapolated from too little)
        peak = max(int(kernel.peak_increase), int(peak_increase))
        self.kernel.observe(features, peak, int(kernel.retained))
        self.kernel_unit = kernel.unit
        self.kernel_readings += 1
        level = int(getattr(kernel, "level", 0) or 0)
        if kernel.unit == PROCESS_RESIDENT and level > 0 and (self._top is None or peak_increase >= self._top[0]):
            self._top = (float(peak_increase), level, max(0, int(kernel.peak_increase)))
        self._learn_gap()

    def reuse_credit(self, scale: float) -> float:
        """Bytes the answer on CPU takes off ``scale`` x the tensor figure: the pages the largest
        forward seen brought in and the process still holds (its rise, less what it has released
        since it reached ``level``). The heap keeps them and a larger forward reuses them; counting
        them in the budget's in-use (they are resident) *and* in the forward's figure counted them
        twice: measured under a 700 MiB memory cgroup, a forward predicted at 235 MB raised the
        resident peak 134 MB. The rise, not ``scale`` x its tensors: a forward that rose less than
        the allowance has no such pages to give back, and crediting the difference raised a ViT's
        next answer 1.34x past the batch just run, which the kernel killed (docs/capacity.md).
        Never a penalty (0 where the process is now smaller than when that forward started, or no
        such forward was read), and only where the budget's in-use is read now."""
        if self._top is None:
            return 0.0
        if registry.process() is None:  # no process source: the budget's in-use is not read either
            return 0.0
        rss = resident_now()
        if rss is None:
            return 0.0
        rss -= process_hwm.shared().in_flight_excess(rss)
        tensor, level, rise = self._top
        return max(0.0, min(scale * tensor, rise) - max(0, level - rss))

    # ---- which figures answer ------------------------------------------------------------------
    def _both(self) -> list[tuple[float, float]]:
        """(tensor figure, the largest figure in the limit's units) of each shape read both ways;
        kept until the next forward is observed (a gate asks before every request)."""
        at, both = self._both_cache
        if at == self._observed:
            return both
        tensor = {key_of(r.features): r.peak for r in self.model.shapes()}
        both = [(tensor[k], float(max(r.peaks))) for r in self.kernel.shapes()
                if (k := key_of(r.features)) in tensor and r.peaks]
        self._both_cache = (self._observed, both)
        return both

    def gap_ratio(self) -> float | None:
        """The largest ratio of a shape's figure in its limit's units to its tensor figure, over the
        shapes read both ways whose tensor figure is at least GAP_MIN_BYTES and a quarter of the
        largest (small ones say more of page granularity and first touches than of the forward's
        overhead); None: no such shape.

        Shapes read on a warm heap are left out while others answer: a forward that rose by no more
        than ``WARM_RATIO`` x its tensors was served from pages earlier forwards left resident, and
        says what they saved, not what fresh pages cost. Counted, such a shape lowered the ratio once
        it was the largest (the quarter floor then left out the shapes that showed the heap's cost):
        measured in a 1000 MiB memory cgroup, a server running the batch each answer named saw the
        ratio fall from 1.91 to 1.0 once a batch of 25 had read so, and the next answer, 42, was
        OOM-killed (docs/capacity.md). Nor does a fresh reading of a larger shape lower it: one that
        found part of what it needed resident reads a little over its tensors, and with the warm
        shapes left out it was the allowance alone: in one run the answers went 32, 32, 32, then 44,
        which the kernel killed. The allowance is the largest it has been. Where every shape read is
        warm (a model whose blocks are all mapped fresh), they answer."""
        return self._gap_high

    def _learn_gap(self) -> None:
        """The allowance raised to what the shapes read both ways show now. Run after each forward
        observed, the only time they change, so the answers' threads only read it."""
        both = self._both()
        fresh = [(t, k) for t, k in both if k > WARM_RATIO * t]
        ratios = _ratios_over_floor(fresh) or _ratios_over_floor(both)
        if ratios:
            top = round(max(ratios), 4)
            if self._gap_high is None or top > self._gap_high:
                self._gap_high = top

    def gap_bytes(self) -> int | None:
        """The largest excess, in bytes, of a shape's figure in its limit's units over its tensor
        figure (None: no shape read both ways)."""
        both = self._both()
        return int(max(max(0.0, k - t) for t, k in both)) if both else None

    def answering(self, regime: str, device: str) -> Answering:
        """The tensor fit answers (exact and smooth: its error on shapes left out is a few percent),
        in the units the limit counts where those are read: its upper bounds raised by what the
        kernel was seen to count beyond the tensors. On CPU that is a ratio: a forward's resident
        rise depends on the heap's state (pages the heap kept resident are reused; a fresh heap
        faults in ~1.4x the tensor bytes, measured), so a fit of the rises has that state for noise
        (84 % error on shapes left out, measured) while the worst ratio seen bounds it. On CUDA it is
        bytes: reserved growth is a step function of the shape (a 4 MB request takes a 20 MiB
        segment), so the largest excess of reserved growth over allocated seen is added."""
        if self.kernel_unit == CUDA_RESERVED:
            return Answering(self.model, CUDA_RESERVED, 1.0, float(self.gap_bytes() or 0), None)
        if self.kernel_unit == PROCESS_RESIDENT and mmap_threshold.state().fixed:
            # glibc's mmap threshold fixed (sources/mmap_threshold.py; under a memory limit the
            # defaults fix 1/128 of it): every block over it is mapped fresh and unmapped at free, so
            # a large forward's resident rise is its tensors plus what its blocks under the threshold
            # and the buffers its kernels allocate outside the tensors add, tens of MiB whatever the
            # batch (measured at 1 MiB: 472.9 MiB for 473.0 MiB of tensors at batch 43; the largest
            # excess in the cgroup tests: 13-18 MiB at 1 MiB, 21-43 MiB at 7-8 MiB): the largest excess
            # seen is added in bytes, and no credit is taken for heap pages, which blocks over the
            # threshold never reuse. Not only what came and went: what a forward left resident beyond
            # its tensors is in the in-use figure later, but counting only the rest, a ViT's answer
            # rose from 121 to 149 and the kernel killed 149 (a larger batch needs more of such pages)
            gap_bytes = self.gap_bytes()
            if gap_bytes is not None:
                return Answering(self.model, PROCESS_RESIDENT, 1.0, float(gap_bytes), None)
        gap = self.gap_ratio()
        if self.kernel_unit is not None and gap is not None:
            scale = max(1.0, gap)
            credit = self.reuse_credit(scale) if self.kernel_unit == PROCESS_RESIDENT else 0.0
            return Answering(self.model, self.kernel_unit, scale, -credit, None)
        if self.kernel_unit is not None:
            why = (f"no forward of at least {GAP_MIN_BYTES >> 20} MiB of tensors read in "
                   f"{_UNIT_WORDS.get(self.kernel_unit, self.kernel_unit)} yet: tensor figures answer")
        elif device == "cpu":
            down = process_hwm.shared().reason()
            why = (f"{down}: tensor figures answer, not the process's resident memory" if down else
                   "no forward read in the process's resident memory yet: tensor figures answer")
        elif device.startswith("cuda"):
            why = "no forward read in the CUDA allocator's reserved bytes yet: tensor figures answer"
        else:
            why = f"only tensor figures are read on {device}"
        return Answering(self.model, TENSOR, 1.0, 0.0, why)

    # ---- questions -------------------------------------------------------------------------
    def question(self, features: Mapping[str, int]) -> Features:
        """A caller's shape, checked: whole non-negative numbers (a batch and a sequence length of at
        least 1), under names the model's calls give (``MemoryModel.check``): ShapeError otherwise."""
        feats = checked(features)
        if self.model.standard:
            for name in (BATCH, SEQ_LEN):
                if feats.get(name) == 0:
                    raise ShapeError(f"{name} must be at least 1, got 0", (name,))
        self.model.check(feats)
        cut = self.prompt_logits()
        if cut is not None and LOGITS not in feats and regime_of(canonical(feats)) == PREFILL:
            feats[LOGITS] = min(cut, feats.get(SEQ_LEN, cut))  # the call this service runs: a generate() prompt
        return feats

    def prompt_logits(self) -> int | None:
        """Where every prompt measured computed the logits of its last positions only (a service
        that calls ``generate()`` alone: ``logits_to_keep``), the most positions any kept; None where
        a plain forward (every position's logits) was measured, or no prompt. Such a service never
        runs a plain forward, so its questions without ``logits`` and its table are about the
        prompts it does run: a plain forward's logits, 64x more positions than any it computed, were
        outside every shape seen, and every row of its table "not known"."""
        at, cut = self._logits_cache
        if at == self._observed:  # a gate asks before every request: once per forward observed
            return cut
        cut = self._prompt_logits()
        self._logits_cache = (self._observed, cut)
        return cut

    def _prompt_logits(self) -> int | None:
        kept = []
        for r in self.model.shapes():
            if regime_of(r.features) != PREFILL:
                continue
            if LOGITS not in r.features:
                return None  # canonical: logits equal to seq_len (every position) are left out
            kept.append(r.features[LOGITS])
        return max(kept) if kept else None

    def predict(self, features: Mapping[str, int], device: str = "cpu") -> Prediction:
        """The answer for one shape, in the limit's units. Past ``capacity.max_extrapolation`` it is
        not known, as in the max-safe-batch table: ``upper_bytes`` None and ``reason`` say so, and
        ``estimate_bytes`` keeps the fit's own figure (a gate can still refuse what that alone
        exceeds: ``verdict``)."""
        feats = self.question(features)
        a = self.answering(regime_of(canonical(feats)), device)
        p = a.model.predict(feats)

        def in_limit_units(b: int) -> int:
            # never below the tensor figure: pages the heap kept may be reused (the credit), but the
            # forward's tensors are a floor the kernel counts whatever the heap held
            return max(b, int(math.ceil(b * a.scale + a.extra)))

        upper = in_limit_units(p.upper_bytes) if p.upper_bytes is not None else None
        estimate = in_limit_units(p.peak_increase_bytes) if p.peak_increase_bytes is not None else None
        reason = p.reason
        limit = self.config.max_extrapolation
        if upper is not None and p.extrapolation_factor > limit:
            upper, reason = None, (f"{p.extrapolation_factor:g}x outside the shapes seen, more than "
                                   f"capacity.max_extrapolation ({limit:g}x): not known")
        return dataclasses.replace(p, unit=a.unit, upper_bytes=upper, gap_ratio=a.scale if a.scale > 1.0 else None,
                                   gap_bytes=int(a.extra) if a.extra > 0 else None, reason=reason,
                                   estimate_bytes=estimate)

    @staticmethod
    def verdict(p: Prediction, available_bytes: int) -> bool | None:
        """Does the prediction fit in ``available_bytes``: True, False, or None (not known). Its
        upper bound decides; where there is none because the shape lies past
        ``capacity.max_extrapolation``, the fit's own estimate over what is available is a no (the fit
        is non-decreasing in every feature, and the error only adds), anything else is not known."""
        if p.upper_bytes is not None:
            return p.upper_bytes <= available_bytes
        if p.estimate_bytes is not None and p.estimate_bytes > available_bytes:
            return False
        return None

    def fits(self, device: str, features: Mapping[str, int], unknown: bool = True) -> bool:
        """Would a forward of this shape fit now? The prediction plus its error against what the
        device has available; ``unknown`` when the model or the limit cannot tell: too few shapes,
        no limit, or a shape past ``capacity.max_extrapolation`` whose estimate alone would fit
        (the table's "not known"). A feature the model never saw, or one it needs and was not
        given, is a ShapeError, never ``unknown``: a gate with a typo must fail at its first
        request, not stay open."""
        p = self.predict(features, device)
        budget, _ = self.budgets.read(device)
        if budget is None:
            return unknown
        v = self.verdict(p, budget.available_bytes)
        return unknown if v is None else v

    def table_state(self, model: MemoryModel | None = None) -> tuple[FitState | None, str | None]:
        """The fit the max-safe-batch table is read from: the prompts of the kind of call with a
        ``batch`` feature and the most forwards; else None and why."""
        model = model or self.model
        kinds = model.kinds()
        if not kinds:
            return None, "no forward measured yet"
        mine = [st for st in model.states().values() if st.regime == PREFILL and BATCH in st.base]
        if not mine:
            if not any(BATCH in b for b in kinds):
                return None, (f"the max-safe-batch table needs a feature named {BATCH!r}: the model's features are "
                              f"{names_text(set().union(*kinds))} (a shape_of names its batch dimension 'batch')")
            return None, "no prompt (cache_len 0) measured yet"
        st = max(mine, key=lambda s: kinds.get(s.base, 0))
        if st.reason is not None:
            return None, st.reason
        return st, None

    def table_seq_lens(self, model: MemoryModel | None = None, state: FitState | None = None) -> list[int]:
        if self.config.seq_lens:
            return list(self.config.seq_lens)
        shapes = (model or self.model).shapes()
        if state is not None:
            shapes = [r for r in shapes if family_of(r.features) == (state.regime, state.base)]
        seen = sorted({r.features[SEQ_LEN] for r in shapes if SEQ_LEN in r.features})
        return seen[-TABLE_ROWS:]

    def _fixed_others(self, st: FitState, leave: set[str]) -> dict[str, int]:
        """Features other than those asked about, at their largest value seen (conservative). A KV
        cache's length is 0 (the table is of prompts: what a decode step adds is in use already, and
        the cache's growth is in the allocator's level), so left out, implied. Logits: every
        position's (a plain forward's, the larger: implied, left out), unless the model only ever ran
        ``generate()`` prompts (``prompt_logits``): then as many as those kept."""
        out = {n: hi for n, (_, hi) in st.ranges.items() if n not in leave | {CACHE_LEN, LOGITS}}
        if LOGITS in st.names and (cut := self.prompt_logits()) is not None:
            out[LOGITS] = cut
        return out

    def table_call(self) -> dict[str, Any]:
        """Which kind of call the max-safe-batch table is about (``/v1/headroom``'s ``table_call``)."""
        cut = self.prompt_logits()
        if cut is None:
            return {"kind": "forward", "logits": None,
                    "text": "plain forwards and generate() prompts, every position's logits computed"}
        return {"kind": "generate", "logits": cut,
                "text": f"generate() prompts: the logits of the last {cut} position{'s' if cut != 1 else ''} "
                        "(the only prompts this model ran)"}

    def table(self, available: int, device: str = "cpu") -> tuple[list[dict[str, Any]], str | None]:
        """The max-safe-batch table: one row per sequence length (one row, ``seq_len`` None, for a
        model without one), each with the largest safe batch or why it is not known, how far outside
        the shapes seen it lies and the error it carries; or no rows and why."""
        a = self.answering(PREFILL, device)
        st, why = self.table_state(a.model)
        if st is None:
            return [], why
        others = self._fixed_others(st, {BATCH, SEQ_LEN})
        lens: list[int | None] = list(self.table_seq_lens(a.model, st)) if SEQ_LEN in st.names else [None]
        rows = []
        for s in lens:
            fixed = {**others, SEQ_LEN: s} if s is not None else others
            r = a.model.safe_limit(available, fixed, BATCH, scale=a.scale, extra=a.extra,
                                   max_extrapolation=self.config.max_extrapolation, state=st)
            d = r.to_dict()
            rows.append({"seq_len": s, "batch": d.pop("value"), **d})
        return rows, None

    def max_safe_batches(self, available: int, device: str = "cpu") -> dict[int | str, int]:
        """Sequence length (``"any"`` for a model without one, as in ``/v1/headroom``) -> the largest
        batch known to fit (the metric's series): a row's answer, or where it lies past
        ``capacity.max_extrapolation``, its ``at_least`` (a lower bound, the safe side); rows not
        known at all are left out."""
        out: dict[int | str, int] = {}
        for r in self.table(available, device)[0]:
            n = r["batch"] if r["batch"] is not None else r["at_least"]
            if n is not None:
                out["any" if r["seq_len"] is None else r["seq_len"]] = n
        return out

    def max_safe_seq_len(self, available: int, batch: int, device: str = "cpu") -> SafeLimit:
        a = self.answering(PREFILL, device)
        st, why = self.table_state(a.model)
        if st is None or SEQ_LEN not in st.names:
            return SafeLimit(None, None, None, why or "the model has no seq_len feature")
        others = self._fixed_others(st, {BATCH, SEQ_LEN})
        return a.model.safe_limit(available, {**others, BATCH: batch}, SEQ_LEN, scale=a.scale, extra=a.extra,
                                  max_extrapolation=self.config.max_extrapolation, state=st)

    def max_safe_batch_for(self, features: Mapping[str, int], device: str = "cpu") -> int | None:
        """The largest batch that fits now with the request's other features as they are (its
        seq_len, its cache): the knob an OOM's cause names. None without a budget, a ``batch``
        feature or an answer from the model."""
        feats = checked(features)
        if BATCH not in feats:
            return None
        budget, _ = self.budgets.read(device)
        if budget is None:
            return None
        a = self.answering(regime_of(feats), device)
        fixed = {k: v for k, v in feats.items() if k != BATCH}
        return a.model.max_safe(budget.available_bytes, fixed, BATCH, scale=a.scale, extra=a.extra)

    def figures(self, device: str, now_unix: float | None = None) -> CapacityFigures:
        now = time.time() if now_unix is None else now_unix
        budget, _ = self.budgets.read(device)
        model, unit = self.answering(PREFILL, device)[:2]
        largest = model.largest_recent(now - self.config.recent_window)
        predicted = measured = headroom = None
        if largest is not None:
            measured = largest.peak
            try:  # a shape the model itself learnt: its names always check
                p = self.predict(largest.features, device)
            except ShapeError:
                p = None
            if p is not None and p.peak_increase_bytes is not None:
                predicted = float(p.peak_increase_bytes)
                if budget is not None and p.upper_bytes is not None:
                    headroom = float(budget.available_bytes - p.upper_bytes)
        table = self.max_safe_batches(budget.available_bytes, device) if budget is not None else {}
        ready = budget is not None and any(st.fit is not None and st.reason is None and st.error_ratio is not None
                                           for st in model.states().values())
        return CapacityFigures(device, predicted, measured, headroom, model.error_ratio, table, budget, unit, ready)

    def answer(self, device: str, features: Mapping[str, int] | None) -> dict[str, Any]:
        """The model's document in ``/v1/headroom`` (``features`` None: the table), the same from
        ``h.headroom()``. ShapeError for a shape the model cannot be asked about."""
        if features is not None:
            features = self.question(features)
        budget, why_no_limit = self.budgets.read(device)
        a = self.answering(regime_of(canonical(features)) if features is not None else PREFILL, device)
        model, unit = a.model, a.unit
        doc: dict[str, Any] = {"enabled": True, "device": device, "unit": unit, "unit_note": a.note,
                               "gap_ratio": self.gap_ratio(),
                               "gap_bytes": self.gap_bytes(), "reuse_credit_bytes": int(max(0.0, -a.extra)),
                               "heap": mmap_threshold.state().to_dict() if device == "cpu" else None,
                               "kernel_readings": self.kernel_readings, "model_fit": model.describe(),
                               "note": model.kinds_note(),
                               "budget": budget.to_dict() if budget is not None else None,
                               "budget_reason": why_no_limit,
                               "shapes": [r.to_dict() for r in sorted(model.shapes(),
                                                                      key=lambda r: sorted(r.features.items()))],
                               "shape_errors": self.shape_errors, "root_readings": self.root_readings,
                               "root_readings_dropped": self.root_readings_dropped,
                               "max_extrapolation": self.config.max_extrapolation}
        if features is not None:
            p = self.predict(features, device)
            doc["prediction"] = p.to_dict()
            fits = None
            if budget is not None:
                fits = self.verdict(p, budget.available_bytes)
                if p.upper_bytes is not None:
                    doc["headroom_bytes"] = budget.available_bytes - p.upper_bytes
            doc["fits"] = fits
            return doc
        if budget is not None:
            rows, why = self.table(budget.available_bytes, device)
            doc["max_safe_batch"] = {("any" if r["seq_len"] is None else str(r["seq_len"])): r["batch"] for r in rows}
            doc["max_safe_batch_rows"] = rows
            doc["max_safe_batch_reason"] = why
            doc["table_call"] = self.table_call()
            if self.config.batch is not None:
                r = self.max_safe_seq_len(budget.available_bytes, self.config.batch, device).to_dict()
                doc["max_safe_seq_len"] = {"batch": self.config.batch, "seq_len": r.pop("value"), **r}
        else:
            doc["max_safe_batch_reason"] = f"no limit known: {why_no_limit}"
        return doc


__all__ = ["Capacity", "CapacityFigures", "ShapeError"]  # ShapeError: its home is memprof_otel.errors
