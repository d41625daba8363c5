"""The answer of ``GET /v1/advice``: the advice in scope, and notes saying what could not be checked.

An empty advice list means two different things: nothing measured calls for action, or nothing was
measured yet. The notes tell them apart, so a caller never mistakes a process that was not looked
at for a healthy one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .evidence import Evidence
from .items import Advice, severity_rank
from .rules import RULE_IDS, advise


@dataclass(frozen=True)
class AdviceReport:
    advice: tuple[Advice, ...]
    notes: tuple[str, ...]
    model: str | None
    min_severity: str
    devices: tuple[str, ...]     # devices whose allocator figures were read
    models: tuple[str, ...]      # models whose layer figures were read

    def to_dict(self) -> dict[str, Any]:
        return {"advice": [a.to_dict() for a in self.advice], "notes": list(self.notes),
                "model": self.model, "min_severity": self.min_severity,
                "checked": {"devices": list(self.devices), "models": list(self.models), "rules": list(RULE_IDS)}}


def severity_by_id(items: Sequence[Advice]) -> dict[str, int]:
    """Rule id -> the most severe of its advice now, as ``memprof_advice_severity`` reads it: 0 none,
    1 info, 2 warning, 3 critical. Every id, at 0 without advice: a dashboard and a rule see the
    series before the first advice."""
    out = {rid: 0 for rid in RULE_IDS}
    for a in items:
        out[a.id] = max(out[a.id], severity_rank(a.severity) + 1)
    return out


def notes(ev: Evidence, model: str | None = None) -> list[str]:
    """What is missing for some rules to have anything to check."""
    out: list[str] = []
    if not ev.sampled:
        out.append("no sample yet: monitoring has not started or has not read the allocators, so the allocator "
                   "rules (cuda-fragmentation, cache-slack, glibc-arena-free, alloc-retries, oom) had nothing "
                   "to check")
    else:
        if not any(d.startswith("cuda") for d in ev.allocators):
            out.append("no CUDA allocator figures: the CUDA rules (cuda-fragmentation, cache-slack, "
                       "alloc-retries) had nothing to check")
        if "cpu" not in ev.allocators:
            out.append("no glibc heap figures (malloc is not glibc, or glibc has no mallinfo2): "
                       "glibc-arena-free had nothing to check")
    attributed = {m.model for m in ev.models}
    if not ev.instrumented:
        out.append("no instrumented model: layer-transient-peak needs mp.instrument(model) and an attributed "
                   "forward")
    for name in sorted(n for n in ev.instrumented if n not in attributed and model in (None, n)):
        out.append(f"model {name!r} has no attributed forward yet: layer-transient-peak had nothing to check")
    if not ev.leak_watch:
        out.append("the leak watch is not running (monitoring not started, or leaks.enabled: false): "
                   "leak-suspect had nothing to check")
    if not ev.capacity:
        out.append("no capacity facts yet: near-limit had nothing to check")
    return out


def _in_scope(a: Advice, model: str, device: str | None) -> bool:
    """Advice about ``model``, about the device it runs on, or about the whole process."""
    if "model" in a.context:
        return a.context["model"] == model
    return "device" not in a.context or a.context["device"] == device


def build_report(ev: Evidence, model: str | None = None, min_severity: str = "info",
                 model_device: str | None = None) -> AdviceReport:
    """The advice at or above ``min_severity`` (ValueError for an unknown one); with ``model``, only
    the advice about that model, the device it runs on (``model_device``) and the process."""
    floor = severity_rank(min_severity)
    items: Sequence[Advice] = [a for a in advise(ev) if severity_rank(a.severity) >= floor]
    if model is not None:
        items = [a for a in items if _in_scope(a, model, model_device)]
    return AdviceReport(advice=tuple(items), notes=tuple(notes(ev, model)), model=model, min_severity=min_severity,
                        devices=tuple(sorted(ev.allocators)), models=tuple(sorted(m.model for m in ev.models)))
