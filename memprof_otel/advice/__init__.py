"""Advice that cites its measurements: pure rules over what memprof-otel already measured.

Each rule reads plain numbers (``Evidence``: allocator figures per device, per-layer peaks, leak
suspects, capacity facts, OOM counts, the last OOM's cause) and answers ``Advice`` items that name the
figures that triggered them, what to do, and where the docs explain it. Nothing here reads a device,
imports torch, or changes the process: gathering the evidence is the service's, acting on the advice
is the user's.

``service.py`` ``Advisor``: gathers the evidence, answers ``GET /v1/advice``, contributes its series
``evidence.py`` what the rules read: plain numbers, gathered by the service (pure)
``items.py`` one advice item and the figures it cites (pure)
``report.py`` the ``GET /v1/advice`` document, with notes on what could not be checked (pure)
``rules.py`` the rules, each reading the evidence and citing the figures it acted on (pure)

Public: ``GET /v1/advice``, ``memprof-otel advise``, the ``memprof_advice_severity`` family and the
rule ids (docs/advice.md). The names imported below are for the other packages (the endpoint, the CLI);
the module paths are internal.
"""
from __future__ import annotations

from .evidence import CapacityFacts, Evidence, LeakSuspect, ModelLayers, OomCauseFacts
from .items import SEVERITIES, Advice, Figure, severity_rank
from .report import AdviceReport, build_report, severity_by_id
from .rules import RULE_IDS, advise, advised_layer

__all__ = ["RULE_IDS", "SEVERITIES", "Advice", "AdviceReport", "CapacityFacts", "Evidence", "Figure",
           "LeakSuspect", "ModelLayers", "OomCauseFacts", "advise", "advised_layer", "build_report", "severity_by_id",
           "severity_rank"]
