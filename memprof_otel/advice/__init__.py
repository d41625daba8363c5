"""Advice that cites its measurements: pure rules over what memprof-otel already measured.

Each rule reads plain numbers (``Evidence``: allocator figures per device, per-layer peaks, leak
suspects, capacity facts, OOM counts, the last OOM's cause) and answers ``Advice`` items that name the figures that
triggered them, what to do, and where the docs explain it. Nothing here reads a device, imports
torch, or changes the process: gathering the evidence is the adapter's (``adapter.py``, which the
composition root builds), acting on the advice is the user's.
"""
from __future__ import annotations

from .evidence import CapacityFacts, Evidence, LeakSuspect, ModelLayers, OomCauseFacts
from .items import SEVERITIES, Advice, Figure, severity_rank
from .report import AdviceReport, build_report, severity_by_id
from .rules import RULE_IDS, advise, advised_layer

__all__ = ["RULE_IDS", "SEVERITIES", "Advice", "AdviceReport", "CapacityFacts", "Evidence", "Figure",
           "LeakSuspect", "ModelLayers", "OomCauseFacts", "advise", "advised_layer", "build_report", "severity_by_id",
           "severity_rank"]
