"""The OOM flight recorder: when a forward raises an out-of-memory error, keep what led to it.

It counts the OOM, finds the failing layer (from the attribution stack when the forward was being
attributed, else from the traceback's module frames), and stores a dump with the last samples, the
open operations and the layer's stats. It never swallows or changes the exception: it observes the
forward's end, and the error continues up the caller's stack as it was.
"""
from __future__ import annotations

import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._log import rate_limited
from ..oom import is_oom

if TYPE_CHECKING:
    from ..attribution.torch.instrumentation import Instrumentation

LAST_SAMPLES = 30


def failing_layer(h: "Instrumentation", exc: BaseException) -> str | None:
    """The innermost module of ``h``'s model on the exception's traceback, as a module path."""
    model = h.model
    if model is None:
        return None
    paths = {id(m): p for p, m in model.named_modules()}
    found = None
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if owner is not None and id(owner) in paths:
            found = paths[id(owner)]
        tb = tb.tb_next
    return found


class OomRecorder:
    """A forward observer (see ``Instrumentation._observers``)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def forward_begin(self, h: "Instrumentation", state: Any) -> None:
        return None

    def forward_done(self, h: "Instrumentation", state: Any, raised: bool, exc: BaseException | None) -> None:
        if not raised or not is_oom(exc):
            return
        from .service import dump_service
        from ..runtime import runtime

        assert exc is not None
        rt = runtime()
        device = h.last_device
        if not device.startswith("cuda"):  # CUDA's allocator counts its own OOMs (num_ooms)
            rt.extra_ooms[device] += 1
        layer = failing_layer(h, exc)
        samples = rt.sampler.samples()[-LAST_SAMPLES:] if rt.sampler is not None else []
        doc = {
            "kind": "oom", "model": h.name, "device": device, "time": time.time(),
            "failing_layer": layer, "exception": f"{type(exc).__name__}: {exc}"[:2000],
            "samples": [s.to_dict() for s in samples],
            "open_operations": [r.to_dict() for r in rt.tracker.records() if r.open],
            "layer_stats": {k: v.to_dict() for k, v in h.layer_stats().items()},
        }
        info = dump_service().store_json(doc, kind="oom", model=h.name)
        doc["dump_id"] = info.id if info is not None else None
        self.records.append(doc)
        del self.records[:-20]
        rate_limited.warning("oom", "memprof_otel: %s raised out-of-memory in layer %r on %s; flight "
                             "record %s", h.name, layer, device, doc["dump_id"])


recorder = OomRecorder()
