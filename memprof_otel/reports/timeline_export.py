"""``export_timeline(path)``: events, layer stats and the summary as one JSON file."""
from __future__ import annotations

import os
from typing import Any, Callable, Protocol

from ..files import write_json_atomic
from ..timeline import OperationRecord, Sample


class TimelineSubject(Protocol):
    """What a timeline file is built from: an instrumentation handle and the process history it
    was given (the sampler's samples and the operations, as ``GET /v1/timeline`` gives them)."""

    name: str
    process_history: Callable[[], tuple[list[Sample], list[OperationRecord]]]

    def events(self) -> list[dict[str, Any]]: ...
    def layer_stats(self) -> dict[str, Any]: ...
    def summary_dict(self) -> dict[str, Any]: ...


def timeline_document(h: TimelineSubject) -> dict[str, Any]:
    samples, operations = h.process_history()
    return {
        "format": "memprof-otel.timeline/1",
        "model": h.name,
        "events": h.events(),
        "layer_stats": {k: v.to_dict() for k, v in h.layer_stats().items()},
        "summary": h.summary_dict(),
        "samples": [s.to_dict() for s in samples],
        "operations": [r.to_dict() for r in operations],
    }


def write_timeline(h: TimelineSubject, path: str | os.PathLike[str]) -> None:
    write_json_atomic(timeline_document(h), path)
