"""The duties a framework adapter must fill in (``attribution/adapter.py``): a subclass of the handle
that misses one cannot be built, so a third adapter finds out at ``instrument()``, not at the first
forward that needs the duty."""
from __future__ import annotations

from typing import Any

import pytest

from memprof_otel.attribution.adapter import FrameworkAdapter
from memprof_otel.attribution.instrumentation import Instrumentation
from memprof_otel.config import load_config

DUTIES = ["model", "paused", "layer_count", "layer_objects", "object_paths", "attribution_method", "_detach",
          "_reattach", "_begin_attributed", "_begin_root_reading"]


def _complete() -> dict[str, Any]:
    """A class body that fills in every duty, doing nothing."""
    return {"model": property(lambda self: None), "paused": property(lambda self: False),
            "layer_count": property(lambda self: 0), "layer_objects": lambda self: [],
            "attribution_method": property(lambda self: "nothing read"),
            "object_paths": lambda self: {}, "_detach": lambda self: None, "_reattach": lambda self: None,
            "_begin_attributed": lambda self, opener, path, t, cap, compiled: None,
            "_begin_root_reading": lambda self, opener, t: None}


def test_the_declared_duties_are_the_abstract_methods():
    assert sorted(FrameworkAdapter.__abstractmethods__) == sorted(DUTIES)
    assert sorted(Instrumentation.__abstractmethods__) == sorted(DUTIES)


def test_an_adapter_with_every_duty_is_built():
    # GIVEN an adapter that fills in every duty
    adapter = type("Complete", (Instrumentation,), _complete())
    # WHEN its handle is built THEN it is, with the defaults of the optional duties
    h = adapter("m", load_config())
    assert h.held_tensors() == {} and h._release_open_forwards() is None and h.captures_ops
    assert h.status()["figures"] == "nothing read" and h.status()["layers"] == 0 and not h.paused


@pytest.mark.parametrize("duty", DUTIES)
def test_an_adapter_missing_a_duty_fails_at_construction(duty: str):
    # GIVEN an adapter whose class leaves out one duty
    body = _complete()
    del body[duty]
    adapter = type("Incomplete", (Instrumentation,), body)
    # WHEN its handle is built THEN it is refused, naming the duty
    with pytest.raises(TypeError, match=duty):
        adapter("m", load_config())


def test_the_neutral_handle_alone_is_not_a_handle():
    with pytest.raises(TypeError, match="abstract"):
        Instrumentation("m", load_config())  # type: ignore[abstract]
